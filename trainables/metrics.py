"""Every metric a trial logs (MLflow, at its RL step; Ray Train's reports carry the same names): the
one place they are documented. docs/metrics.md's table is `python -m trainables.metrics`, and a
test holds what real trials log against `METRICS`.

A name may hold placeholders in angle brackets (`val/<benchmark>/<metric>`), each standing for the
values `PLACEHOLDERS` lists.
"""

from __future__ import annotations

import re

from trainables.names import REASONS

OBJECTIVE_NAMESPACES = ("val/", "rollout/", "policy/", "oger/", "offline/", "tis/")  # what can rank trials
SUMMARY_NAMESPACES = (*OBJECTIVE_NAMESPACES, "timing/")  # what a trial's final table shows

METRICS: dict[str, str] = {
    # The rollouts (sums over ranks, then means over the step's sequences).
    "rollout/reward_mean": "mean reward of the step's rollouts (R_m; + R_OGER and the teachers' with oger*)",
    "rollout/accuracy": "share of the online rollouts math-verify judges correct",
    "rollout/response_length": "mean response tokens of the online rollouts",
    "rollout/stop_fraction": "share of rollouts that ended with EOS (the rest hit the length cap)",
    "rollout/frac_zero_std": "share of groups whose rewards are all equal (no advantage to learn from)",
    "rollout/verify_<reason>": "rollouts per verdict: correct, wrong, no_think, no_boxed, parse_error, timeout",
    "rollout/ead_decay": "EAD: the step's decay d_s = min(d0 + 5 s, 40000)",
    "rollout/policy_lag": "optimizer steps between the policy that generated the batch and the one it updates "
    "(0; with rollout.overlap 1 one step's, from the second step)",
    "rollout/accuracy_online_kept": "luffy, oger*: accuracy of the online members that stayed in their groups",
    # The update.
    "policy/entropy": "mean token entropy of the policy on the trained responses",
    "policy/clip_fraction": "share of tokens whose ratio was clipped",
    "policy/kl": "mean KL estimate to the reference policy (0 without one)",
    "policy/grad_norm": "gradient norm at the step's last optimizer step",
    "policy/lr": "learning rate at the step's last optimizer step",
    "policy/offpolicy_token_share": "share of trained tokens from teacher trajectories",
    "learner/pad_fraction": "padding in the update's micro-batches",
    "tis/weight_mean": "mean truncated importance weight min(exp(logp_old - logp_beh), C) over tokens",
    "tis/weight_max": "largest importance weight of the step",
    "tis/capped_fraction": "share of tokens whose weight hit the cap C",
    # Teacher members and OGER.
    "offline/replaced": "luffy, oger*: online members replaced by teacher trajectories",
    "offline/accuracy": "luffy, oger*: share of the teacher members judged correct",
    "offline/groups_without_data": "luffy, oger*: groups whose prompt has no teacher trajectory",
    "offline/advantage_mean": "luffy, oger*: mean advantage of the teacher members",
    "offline/trajectories": "luffy, oger*, once: teacher trajectories in the offline store",
    "offline/prompts": "luffy, oger*, once: prompts that have at least one",
    "offline/<teacher>/<count>": "luffy, oger*, once, per teacher (the OGER paper's Table 1): read, valid, "
    "mean_tokens, mean_tokens_read, accuracy_before_filter",
    "offline/skipped/<skip>": "luffy, oger*, once: rows left out of the store, per reason",
    "offline/verifier/<reason>": "luffy, oger*, once: the teachers' verdicts",
    "oger/divergence_mean": "oger*: mean divergence D of the online members that stayed (eq. 5)",
    "oger/last_token_entropy_mean": "oger*: their mean last-token entropy H (eq. 6)",
    "oger/exploration_mean": "oger*: their mean exploration reward R_OGER (eq. 7)",
    "oger/exploration_max": "oger*: the largest R_OGER of the step",
    # Validation, every `validation.every` steps.
    "val/accuracy": "the objective: each validation benchmark's avg@k, macro-averaged",
    "val/accuracy_se": "its standard error over problems and samples",
    "val/response_length": "mean response tokens on the validation benchmarks",
    "val/<benchmark>/<metric>": "avg_at_k, pass_at_j, maj_at_j, worst_at_k, response_length of one benchmark "
    "(`macro`: over several)",
    "<val>_base": "any val/* of the policy before training, logged once at step 0, where each val/* curve also "
    "starts (computed once per identical setting and machine, reused from `<cache_dir>/validations`)",
    # Time, seconds of rank 0.
    "timing/<phase>": "seconds of a phase of the step: generate, score, old_logprob, offline, update, sync, "
    "validate, report, checkpoint, and the whole step",
    "timing/tokens_per_s": "response tokens of the step per second of the step",
    "timing/encoder": "oger*: the encoder actor's busy seconds in the step, every rank's texts",
    "timing/startup": "at the first step: the driver's start to the first step",
    "timing/startup_<stage>": "its stages: ray, worker_imports, train_setup, data, learner, restore_and_sync",
    "timing/loop_wall": "cumulative seconds of the training loop",
    "timing/logging": "cumulative seconds rank 0 spent logging",
    # Progress and faults.
    "progress/step": "RL steps done: the time axis of Tune's schedulers",
    "progress/optimizer_step": "optimizer steps done (`learner.minibatches` per RL step)",
    "progress/val_step": "in reports to Tune: the RL step of the validation a report carries",
    "progress/preempted": "in reports to Tune: 1 when the trial stopped for a resume",
    "faults/service_losses": "cumulative rollout-service calls lost to a dead or hung engine, then retried",
    "faults/resumed_from_step": "at a resume: the RL step the trial continued from",
    "faults/redone_steps": "at a resume: steps computed again since the last checkpoint",
    # A sweep's or a study's seeds: each trial run also carries its configuration's figures.
    "config/<objective>/<statistic>": "the configuration's mean, ci_low, ci_high over its seeds",
}


# What a placeholder stands for: one of these, or None: any path component ("..." : any name).
PLACEHOLDERS: dict[str, tuple[str, ...] | str | None] = {
    "reason": REASONS,
    "phase": (
        "generate",
        "score",
        "old_logprob",
        "offline",
        "update",
        "sync",
        "validate",
        "report",
        "checkpoint",
        "step",
    ),
    "stage": ("ray", "worker_imports", "train_setup", "data", "learner", "restore_and_sync"),  # in order
    "statistic": ("mean", "ci_low", "ci_high"),
    "count": ("read", "valid", "mean_tokens", "mean_tokens_read", "accuracy_before_filter"),
    "teacher": None,
    "skip": None,
    "benchmark": None,
    "metric": None,
    "val": "val/...",
    "objective": "...",
}


def _pattern(name: str) -> re.Pattern:
    def part(text: str) -> str:
        if not text.startswith("<"):
            return re.escape(text)
        values = PLACEHOLDERS[text[1:-1]]
        if values is None:
            return r"[^/]+"
        if isinstance(values, str):
            return re.escape(values.removesuffix("...")) + ".+"
        return "(?:" + "|".join(map(re.escape, values)) + ")"

    return re.compile("".join(part(text) for text in re.split(r"(<[a-z_]+>)", name)))


PATTERNS = {name: _pattern(name) for name in METRICS}


def documented(metric: str) -> str | None:
    """The METRICS entry that names `metric`, or None."""
    return next((name for name, pattern in PATTERNS.items() if pattern.fullmatch(metric)), None)


# Metrics only some trials log: the prefix, and what the trial needs for it (`unlogged`).
CONDITIONAL = (
    ("offline/", "an algorithm with teacher trajectories (luffy, oger*)", lambda t: t.preset.uses_offline),
    (
        "rollout/accuracy_online_kept",
        "an algorithm with teacher trajectories (luffy, oger*)",
        lambda t: t.preset.uses_offline,
    ),
    ("oger/", "an algorithm with embeddings (oger, oger_no_refinement)", lambda t: t.preset.needs_embeddings),
    ("rollout/ead_decay", "rollout.decoding.schedule: ead", lambda t: t.rollout.decoding.schedule == "ead"),
)


def unlogged(metric: str, trial) -> str | None:
    """Why a trial of this spec (a TrialConfig) never logs `metric` as a step metric, or None if it does
    (val/* is checked against the validation's own names: `ValidationConfig.metric_names`)."""
    if documented(metric) is None or not metric.startswith(OBJECTIVE_NAMESPACES) or metric.endswith("_base"):
        if not metric.startswith("val/") or metric.endswith("_base"):
            return "not a step metric of a trial (trainables/metrics.py lists them)"
    if metric.startswith("val/") and metric not in (names := trial.validation.metric_names()):
        return (
            f"not a validation metric of this spec; with validation.samples={trial.validation.samples} "
            f"they are {', '.join(names)}"
        )
    return next(
        (
            f"logged only with {needs}"
            for prefix, needs, logs in CONDITIONAL
            if metric.startswith(prefix) and not logs(trial)
        ),
        None,
    )


def summary_keys(k: int) -> list[str]:
    """The keys of `summarize`'s row for k samples per problem, in table order."""
    powers = [2**i for i in range(k.bit_length())]  # 1, 2, 4, ... <= k
    return [
        f"avg@{k}",
        *(f"pass@{j}" for j in powers),
        *(f"maj@{j}" for j in powers if j < k),
        f"maj@{k}",
        f"worst@{k}",
    ]


def metric_key(key: str) -> str:
    """A row key as a tracking metric name: MLflow allows no "@" (avg@8 -> avg_at_8)."""
    return key.replace("@", "_at_")


def markdown() -> str:
    """docs/metrics.md's table of metrics."""
    rows = [f"| `{name}` | {text} |" for name, text in METRICS.items()]
    return "\n".join(["| metric | what it is |", "|---|---|", *rows]) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
