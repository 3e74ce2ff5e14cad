"""The peers row: TRL's GRPOTrainer against one trial of this project, on the same work.

Both sides train the trial spec's policy on the same prompts in the same order (this project's
`step_prompts`, fed to TRL unshuffled; the prompt token ids are checked equal), rewarded by the same
verifier, in the same shape: P prompts x N samples per RL step, the same new-token budget, micro-batch
and learning rate, one optimizer step per RL step, clip (0.2, 0.28), token-mean loss, group-std
advantages, no KL, a fixed temperature of 1.0, one torch thread per compute process, and the spec's
`learner.gradient_checkpointing` (off in the default; TRL's GRPOConfig defaults to on, which recomputes
every layer in backward, so it is passed explicitly). What differs:
this project runs the rollout service and the verifier as Ray actors, the learner under DeepSpeed
(ZeRO-1) in a Ray Train worker, and syncs the weights to the engine after each step; TRL generates
with transformers in the trainer's own process, under accelerate. TRL is never a dependency of the
product: it is in the `bench` extra.

Ours runs twice: the default synchronous loop, and with rollout.overlap 1 (the engine generates the
next batch during the update, one step off-policy), which TRL's loop does not do.

Start-up is timed to the start of the first RL step: ours from the call to `orchestrator.train.run`
(Ray, the actors, the worker group, whose processes import torch, transformers and DeepSpeed, and
DeepSpeed's engine; the bench's own process has imported the project before), TRL's from its process's
start (its imports of torch, transformers and TRL, the model, the trainer). Beside them, Ray Train's own
start: an empty train function on one rank, the cluster up (`ray_train_floor`).
`python -m bench.peers trl ARGS.json` is TRL's side, run in a fresh process.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

WARMUP_STEPS = 2  # medians over steps 3..N, as the other step-time rows


def shared_settings(cfg) -> dict:
    """The work both sides do, from the trial spec (the settings each side is given)."""
    return {
        "steps": cfg.learner.steps,
        "prompts_per_step": cfg.learner.prompts_per_step,
        "group_size": cfg.rollout.group_size,
        "max_new_tokens": cfg.rollout.max_new_tokens,
        "micro_batch_size": cfg.learner.micro_batch_size,
        "lr": cfg.learner.lr,
        "seed": cfg.seed,
        "gradient_checkpointing": cfg.learner.gradient_checkpointing,
    }


def our_overrides(steps: int, storage: str, name: str) -> list[str]:
    return [
        f"learner.steps={steps}",
        f"name={name}",
        f"storage={storage}",
        "validation.every=0",
        "algorithm.name=grpo",
        "algorithm.use_std=true",
        "algorithm.clip_low=0.2",
        "algorithm.clip_high=0.28",
        "algorithm.loss_agg=token-mean",
        "algorithm.entropy_coef=0.0",
        "algorithm.kl_coef=0.0",
        "rollout.decoding={schedule: fixed, temperature: 1.0}",
        "learner.minibatches=1",
        "learner.num_workers=1",
        "learner.cpus_per_worker=1",
        "checkpoint.every=0",
    ]


def trl_inputs(cfg) -> dict:
    """TRL's side of the same work: the prompts as text in this project's step order, their gold answers
    and the token ids this project would send, for the check."""
    from transformers import AutoTokenizer

    from trainables.data.models import resolve_model_path
    from trainables.data.prompts import prompt_text
    from trainables.rollout.feed import step_prompts
    from trainables.tasks import encode_prompt, train_problems

    model_path = str(resolve_model_path(cfg.model, cfg.cache_dir))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    problems = train_problems(cfg)
    order = [
        i
        for step in range(cfg.learner.steps)
        for i in step_prompts(len(problems), step, cfg.learner.prompts_per_step, 0, 1, cfg.seed)
    ]
    p = cfg.prompt
    return {
        "model_path": model_path,
        "prefill": p.prefill,
        **shared_settings(cfg),
        "prompts": [prompt_text(tokenizer, problems[i], p.template, p.prefill, p.user_format) for i in order],
        "answers": [problems[i].answer for i in order],
        "ids": [encode_prompt(tokenizer, problems[i], p) for i in order[: cfg.learner.prompts_per_step]],
    }


def trl_settings(a: dict, output_dir: str) -> dict:
    """GRPOConfig's arguments for the same work as ours: DAPO's loss and clip, group-scaled rewards, no KL,
    untempered sampling, a constant learning rate, on CPU in fp32."""
    per_step = a["prompts_per_step"] * a["group_size"]
    return dict(
        output_dir=output_dir,
        max_steps=a["steps"],
        learning_rate=a["lr"],
        per_device_train_batch_size=a["micro_batch_size"],
        gradient_accumulation_steps=per_step // a["micro_batch_size"],
        num_generations=a["group_size"],
        max_completion_length=a["max_new_tokens"],
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",
        scale_rewards="group",
        beta=0.0,
        num_iterations=1,
        shuffle_dataset=False,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        seed=a["seed"],
        gradient_checkpointing=a["gradient_checkpointing"],
        use_cpu=True,
        bf16=False,
        fp16=False,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def trl_main(args_path: str) -> None:
    """TRL's GRPOTrainer on `args_path`'s work; prints {"step_s": [...], "startup_s": s} as JSON."""
    start = time.perf_counter()  # the process's start, before its imports
    import torch

    torch.set_num_threads(1)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from trainables.rewards.verify import score_batch

    a = json.loads(Path(args_path).read_text())
    tokenizer = AutoTokenizer.from_pretrained(a["model_path"])
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in a["prompts"][: a["prompts_per_step"]]]
    if ids != a["ids"]:
        raise SystemExit("TRL's prompt token ids differ from this project's: not the same work")

    def reward(prompts, completions, answer, **_) -> list[float]:
        return score_batch([a["prefill"] + c for c in completions], answer)[0]

    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            marks.append(time.perf_counter())

        def on_train_end(self, args, state, control, **kwargs):
            marks.append(time.perf_counter())

    config = GRPOConfig(**trl_settings(a, str(Path(args_path).parent / "trl")))
    model = AutoModelForCausalLM.from_pretrained(a["model_path"], dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"prompt": a["prompts"], "answer": a["answers"]}),
        callbacks=[Clock()],
    )
    trainer.train()
    print(json.dumps({"startup_s": marks[0] - start, "step_s": [b - a for a, b in zip(marks, marks[1:])]}))


def run_trl(cfg, folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    args = folder / "trl_args.json"
    args.write_text(json.dumps(trl_inputs(cfg)))
    done = subprocess.run([sys.executable, "-m", "bench.peers", "trl", str(args)], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"TRL's run failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_ours(spec: str, steps: int, storage: Path, overrides: list[str]) -> dict:
    """One trial of this project; its step times and start-up, read back from its MLflow run."""
    from orchestrator import train
    from orchestrator.spec import load_trial_spec
    from orchestrator.tracking import Tracker, default_tracking_uri

    name = f"peers-{time.time_ns()}"
    cfg = load_trial_spec(spec, [*overrides, *our_overrides(steps, str(storage), name)])
    start_ms = time.time() * 1000
    train.run(cfg)
    tracker = Tracker(default_tracking_uri(cfg.storage), cfg.logging.experiment)
    (run,) = tracker.client.search_runs([tracker.experiment_id], f"attributes.run_name = '{name}'")
    steps_s = dict(tracker.metric_history(run.info.run_id, "timing/step"))
    first = next(m for m in tracker.client.get_metric_history(run.info.run_id, "timing/step") if m.step == 1)
    return {
        "step_s": [steps_s[s] for s in sorted(steps_s)],
        "startup_s": (first.timestamp - start_ms) / 1000 - first.value,
    }


def ray_train_floor(storage: Path) -> float:
    """Seconds from `TorchTrainer.fit()` to the first line of an empty train function: one gloo rank, the
    cluster already up. What Ray Train's controller, its actors and its worker group cost before a trial's
    own code starts (no import of this project's, no engine, no DeepSpeed)."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    name, storage = f"floor-{time.time_ns()}", storage.resolve()  # a rank's working folder is not ours
    mark = storage / f"{name}.started"

    def started(config: dict) -> None:  # defined here, so that Ray ships it by value
        Path(config["mark"]).write_text(repr(time.time()))

    start = time.time()
    TorchTrainer(
        started,
        train_loop_config={"mark": str(mark)},
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(storage_path=str(storage), name=name),
    ).fit()
    return float(mark.read_text()) - start


# Ours twice: the default synchronous loop, and generation overlapped with the update (rollout.overlap 1,
# one step off-policy: the same work, the engine generating during the update, which TRL does not do).
OURS = {"ours": [], "ours, overlap 1": ["rollout.overlap=1"]}


def peers_figures(spec: str, storage: Path, steps: int, rounds: int, overrides: list[str]) -> dict:
    """`rounds` rounds of one run per side, the order rotated each round; the medians and their ratios."""
    from orchestrator.spec import load_trial_spec

    cfg = load_trial_spec(spec, [*overrides, *our_overrides(steps, str(storage), "peers")])
    order = [*OURS, "trl"]
    runs: dict[str, list[dict]] = {side: [] for side in order}
    for r in range(rounds):
        for side in order[r % len(order) :] + order[: r % len(order)]:
            runs[side].append(
                run_ours(spec, steps, storage, [*overrides, *OURS[side]])
                if side in OURS
                else run_trl(cfg, storage / f"trl-{r}")
            )
    floor = statistics.median(ray_train_floor(storage) for _ in range(rounds))  # after ours: Ray is up
    per_step = cfg.learner.prompts_per_step * cfg.rollout.group_size
    sides = {}
    for side, results in runs.items():
        step_s = statistics.median(s for result in results for s in result["step_s"][WARMUP_STEPS:])
        sides[side] = {
            "median_step_s": step_s,
            "sequences_per_s": per_step / step_s,
            "startup_s": statistics.median(result["startup_s"] for result in results),
            "runs": results,
        }
    trl = sides["trl"]
    return {
        "sides": sides,
        "rounds": rounds,
        "steps": steps,
        "settings": shared_settings(cfg),
        **{f"{side} / trl, s per step": sides[side]["median_step_s"] / trl["median_step_s"] for side in OURS},
        # Both of ours start alike (the overlap changes nothing before the first step); the first run
        # of the bench's process also starts Ray.
        "ours / trl, start-up": statistics.median(run["startup_s"] for side in OURS for run in runs[side])
        / trl["startup_s"],
        "ray train floor_s": floor,
        "ray train floor / trl, start-up": floor / trl["startup_s"],
    }


if __name__ == "__main__":
    if sys.argv[1:2] != ["trl"] or len(sys.argv) != 3:
        raise SystemExit("usage: python -m bench.peers trl ARGS.json (bench/__main__.py runs it)")
    trl_main(sys.argv[2])
