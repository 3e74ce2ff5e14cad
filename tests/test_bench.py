"""The benchmark's own arithmetic and memory sampler (the whole `python -m bench --quick` runs as a CI
step of its own)."""

from __future__ import annotations

import sys

import pytest

from bench.__main__ import verdict
from bench.process_usage import GIB, peak_memory
from bench.trials import KEYS, STARTUP, steady_figures


def history(steps: int, checkpoint_every: int) -> dict[str, dict[int, float]]:
    """A trial whose every step computes 1.0 s (generate .6, update .4), syncs .05 in a 1.1 s step,
    then reports .02 s and logs .01 s, with a 0.5 s checkpoint every `checkpoint_every` steps (inside
    its report's time, as the trial logs it)."""
    h = {key: {} for key in KEYS}
    wall = logged = 0.0
    for s in range(1, steps + 1):
        wall += 1.1
        h["generate"][s], h["update"][s], h["sync"][s], h["step"][s] = 0.6, 0.4, 0.05, 1.1
        h["loop_wall"][s], h["logging"][s] = wall, logged
        saved = 0.5 if s % checkpoint_every == 0 else 0.0
        if saved:
            h["checkpoint"][s] = saved
        h["report"][s] = 0.02 + saved  # the trial times a checkpointing report with its save
        wall += 0.02 + 0.01 + saved
        logged += 0.01
    h["startup"][1] = 12.0
    for stage, seconds in zip(STARTUP, (1.0, 3.0, 1.0, 1.0, 4.0, 2.0)):
        h[f"startup_{stage}"][1] = seconds
    return h


def test_steady_figures_split_compute_from_overhead():
    f = steady_figures(history(8, 3), steps=8, checkpoint_every=3)
    # window (2, 7]: steps 3..7, and the reports, logs and the checkpoints of steps 3 and 6 after 2..6
    assert f["steady_steps"] == 5 and f["compute_s"] == pytest.approx(5.0)
    assert f["wall_s"] == pytest.approx(5 * 1.13 + 2 * 0.5)
    assert f["overhead"] == pytest.approx(1.13)
    assert f["mean_step_wall_s"] == pytest.approx(1.13)  # a step's wall, its checkpoints apart
    assert f["checkpoint_s"] == pytest.approx(0.5)
    assert f["checkpoint_share_of_interval"] == pytest.approx(0.5 / (3 * 1.13))
    assert f["report_logging_share_of_wall"] == pytest.approx(5 * 0.03 / f["wall_s"])
    assert f["sync_share_of_step"] == pytest.approx(0.05 / 1.1)
    assert f["phase_share_of_step"]["other"] == pytest.approx(0.05 / 1.1)
    assert f["startup_s"] == 12.0
    assert f["startup_stages_s"] == {
        "ray": 1.0,
        "worker_imports": 3.0,
        "train_setup": 1.0,
        "data": 1.0,
        "learner": 4.0,
        "restore_and_sync": 2.0,
    }


def test_verdicts_follow_each_target_direction():
    assert verdict("weight sync / step", 0.049) == "PASS" and verdict("weight sync / step", 0.051) == "FAIL"
    assert verdict("throughput service / direct, hf", 0.96) == "PASS"
    assert verdict("throughput service / direct, hf", 0.90) == "FAIL"
    assert verdict("step time luffy / grpo", 9.0) == "-"  # reported, no target
    assert verdict("generation EAD / fixed, vllm", "vllm is not installed here") == "-"


def test_peak_memory_sees_a_grandchild_allocation():
    # A child that starts a grandchild holding 300 MiB of touched pages: the tree's peak includes it.
    grandchild = "import time; b = b'x' * (300 * 2**20); time.sleep(2)"
    code = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {grandchild!r}])"
    figures = peak_memory([sys.executable, "-c", code], interval_s=0.1)
    assert figures["exit_code"] == 0
    assert 0.29 < figures["peak_pss_gib"] <= figures["peak_rss_gib"] < 1.0
    assert figures["peak_pss_gib"] * GIB > 300 * 2**20


def test_the_decisions_bench_drives_the_sweeps_own_schedulers():
    """One simulated sweep of each procedure, with a configuration far below the rest (10 seed SDs) and
    one far above: Ray's ASHA (old) and the interval rungs (new), both as `sweep.make_scheduler` builds
    them, stop the weak one at its first rung and keep the strong one (an equal one may go too: it lies
    below the strong one's interval); the new procedure confirms the strong one better on fresh seeds
    and spends those seeds' steps."""
    import numpy as np

    from bench.simulated_sweeps import FINAL, NEW, PROCEDURES, STEPS, World, one_sweep, search_config
    from orchestrator import decisions

    sd = 0.04
    means = [FINAL, FINAL - 10 * sd, FINAL + 10 * sd, FINAL]
    for name, procedure in PROCEDURES.items():
        search = search_config(procedure)
        out = one_sweep(search, means, World(np.random.default_rng(0), sd))
        assert 1 in out.pruned and 2 not in out.pruned and out.challenger == 2, name
        assert out.verdict == "better", name
        if search.confirm:  # the interval rungs' one rung is step 10; then fresh pairs up to a look's count
            kept = 4 - len(out.pruned)
            confirmed = out.trial_steps - (kept * STEPS + 10 * len(out.pruned)) * search.seeds
            counts = decisions.looks(search.confirm.seeds, search.confirm.add, search.confirm.max_seeds)
            assert confirmed in [n * 2 * STEPS for n in counts], name
        else:  # ASHA keeps the top half at each rung: it may stop an equal one too
            assert out.trial_steps <= (3 * STEPS + 10) * search.seeds, name
    assert search_config(PROCEDURES[NEW]).scheduler.name == "intervals"


def test_a_simulated_rate_passes_within_twice_its_monte_carlo_error():
    from bench.__main__ import MC_SE

    row = "decisions: P(false better/worse), all equal, new"
    MC_SE[row] = 0.005
    try:
        assert verdict(row, 0.058) == "PASS" and verdict(row, 0.061) == "FAIL"
    finally:
        MC_SE.pop(row)
    assert verdict(row, 0.051) == "FAIL"  # without its error, the target alone


def test_the_peers_row_gives_both_sides_the_same_work():
    """TRL's side is handed the prompts this project's trial reads, in its order, as text whose tokens are
    the trial's prompt ids; the trial's side is GRPO at a fixed T = 1 with one optimizer step per RL step;
    both recompute layers in backward or neither (TRL's own default is to recompute)."""
    from transformers import AutoTokenizer

    from bench.peers import our_overrides, trl_inputs
    from orchestrator.spec import load_trial_spec
    from trainables.rollout.feed import step_prompts
    from trainables.tasks import train_problems

    cfg = load_trial_spec("search_spaces/ead.yaml", our_overrides(3, "runs/bench", "peers"))
    assert (cfg.algorithm.name, cfg.rollout.decoding.schedule, cfg.rollout.decoding.temperature) == (
        "grpo",
        "fixed",
        1.0,
    )
    assert cfg.learner.minibatches == 1 and cfg.validation.every == 0 and cfg.algorithm.kl_coef == 0
    work = trl_inputs(cfg)
    assert work["gradient_checkpointing"] is cfg.learner.gradient_checkpointing is False
    problems = train_problems(cfg)
    first = [problems[i] for i in step_prompts(len(problems), 0, cfg.learner.prompts_per_step, 0, 1, cfg.seed)]
    assert len(work["prompts"]) == 3 * cfg.learner.prompts_per_step and work["answers"][:8] == [p.answer for p in first]
    tokenizer = AutoTokenizer.from_pretrained(work["model_path"])
    assert [tokenizer(t, add_special_tokens=False)["input_ids"] for t in work["prompts"][:8]] == work["ids"]
