"""python infra/gpu_memory.py [SPEC] [--cpu]: one learner rank's memory at a spec's shapes, measured phase by
phase against the `--dry-run` pre-flight, with nothing but torch, transformers and DeepSpeed (no Ray, no
vLLM, no download).

A model of the spec's shape with random weights (its config.json, or the published shape of the paper
specs' models), as one learner rank (the spec's ZeRO stage, world 1) on the GPU, runs one RL update on
one prompt's group of random rows at the spec's longest length (prompt allowance + max_new_tokens), in
micro-batches of the spec's token budget, with its checkpointing, logits chunks and entropy bonus; then
the weight push's learner side into a stand-in engine buffer (each bucket made from the partitions and
packed on the device, as many packed buffers alive as the spec's transfer keeps). For each phase the
peak of `torch.cuda.max_memory_allocated` (reset before it) is printed beside the pre-flight's figure
for it at one rank, less the CUDA context, which the allocator does not see. About 3 minutes for
Qwen2.5-Math-1.5B's spec on an 80 GB card.

`--cpu` runs the same on CPUs at the tiny preset's shapes (`search_spaces/ead.yaml`), with the peaks as
the process's resident high-water marks over its size before the model existed: it keeps the script
working where no GPU is, not a figure to compare.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PAPER_SPEC = "search_spaces/paper/grpo_qwen2.5_math_1.5b.yaml"
CPU_SPEC = "search_spaces/ead.yaml"
PHASES = ("forward", "backward", "optimizer step", "weight push")


class Peaks:
    """Peak memory of each phase: CUDA's allocator on a GPU, the resident high-water mark on a CPU."""

    def __init__(self, gpu: bool):
        import torch

        self.gpu, self.torch, self.seen = gpu, torch, {}
        self.base = 0 if gpu else self.resident()

    def resident(self) -> int:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))

    def start(self) -> None:
        if self.gpu:
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()
        else:
            with open("/proc/self/clear_refs", "w") as refs:  # the high-water mark from here on
                refs.write("5")

    def stop(self, phase: str) -> None:
        if self.gpu:
            self.torch.cuda.synchronize()
            peak = self.torch.cuda.max_memory_allocated()
        else:
            with open("/proc/self/status") as status:
                peak = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
            peak -= self.base
        self.seen[phase] = max(self.seen.get(phase, 0), peak)


def random_model(shape, folder: Path, positions: int) -> Path:
    """A Qwen2 folder of `shape` with random weights (bf16 on disk; the learner loads it as it loads any)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        intermediate_size=shape.intermediate,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        vocab_size=shape.vocab,
        tie_word_embeddings=shape.tied,
        max_position_embeddings=positions,
        dtype="bfloat16",
    )
    with torch.device("cpu"):
        Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    return folder


def watched(learner, peaks: Peaks) -> None:
    """The engine's backward and step, each its own phase; what comes before a backward is its forward."""
    engine = learner.engine
    backward, step = engine.backward, engine.step

    def on_backward(*args, **kwargs):
        peaks.stop("forward")
        peaks.start()
        out = backward(*args, **kwargs)
        peaks.stop("backward")
        peaks.start()
        return out

    def on_step(*args, **kwargs):
        peaks.start()
        out = step(*args, **kwargs)
        peaks.stop("optimizer step")
        peaks.start()  # the next micro-batch's forward
        return out

    engine.backward, engine.step = on_backward, on_step


def push(learner, transfer: str, bucket_bytes: int, device) -> None:
    """The push's learner side into a stand-in engine: each bucket packed on the device, the transfer's
    number of packed buffers alive at once."""
    from trainables.names import PUSH_BUFFERS
    from trainables.rollout.push import GlooPush, learner_weights
    from trainables.rollout.weight_sync import pack

    buffers, where = PUSH_BUFFERS[transfer]
    alive = collections.deque(maxlen=max(buffers, 1))
    weights = learner_weights(learner, GlooPush([], bucket_bytes), device if where == "device" else "cpu")
    for metas, tensors in zip(weights.plan(), weights.buckets, strict=True):
        alive.append(pack(metas, tensors, device if where == "device" else "cpu"))


def one_rank_group(cpu: bool) -> None:
    """A process group of this process alone, on the backend a trial's learner ranks use."""
    import torch.distributed as dist

    from trainables.learner import process_group_backend
    from trainables.rollout.weight_sync import free_port

    os.environ.update(
        RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port("127.0.0.1"))
    )
    dist.init_process_group(process_group_backend(use_gpu=not cpu))


def synthetic_group(vocab: int, group: int, prompt: int, longest: int):
    """One prompt's group of `group` random responses filling the longest sequence, as a train batch, and
    rewards [1, N] that give every row a non-zero advantage."""
    import torch

    from trainables.learner import build_train_batch
    from trainables.rollout.types import RolloutBatch

    ids = torch.randint(vocab, (group, longest), generator=torch.Generator().manual_seed(0)).tolist()
    rollouts = RolloutBatch(
        [ids[0][:prompt]],
        [row[prompt:] for row in ids],
        [[-1.0] * (longest - prompt)] * group,
        [""] * group,
        ["length"] * group,
        n=group,
    )
    return build_train_batch(rollouts, pad_id=0), torch.linspace(0, 1, group).view(1, -1)


def preflight_phases(cfg, shape, cpu: bool) -> dict[str, float]:
    """The pre-flight's bytes for each phase the run measures, less the CUDA context (not the allocator's)."""
    from orchestrator.preflight import learner_estimate
    from trainables.memory import GIB

    mem = learner_estimate(cfg, shape, 4 if cpu else 2)()
    context = 0 if cpu else 1.5 * GIB
    return {
        "forward": mem.states + mem.activations + mem.reserve - context,
        "backward": mem.states + mem.activations + mem.reserve - context,
        "optimizer step": mem.states + mem.step + mem.reserve - context,
        "weight push": mem.states + mem.push + mem.reserve - context,
    }


def run(spec: str, cpu: bool) -> dict:
    import torch
    import torch.distributed as dist

    from orchestrator.preflight import PROMPT_TOKENS, micro_batch_tokens, model_shape
    from orchestrator.spec import load_trial_spec
    from trainables.learner import Learner
    from trainables.memory import GIB

    cfg = load_trial_spec(spec, check_files=False)
    shape, source = model_shape(cfg)
    if shape is None:
        raise SystemExit(f"gpu_memory: no shape for {spec} ({source})")
    longest = PROMPT_TOKENS[cfg.task.name] + cfg.rollout.max_new_tokens
    one_rank_group(cpu)
    import deepspeed  # noqa: F401 - loaded before the CPU's baseline, as the learner's own libraries

    peaks = Peaks(gpu=not cpu)
    with tempfile.TemporaryDirectory() as folder:
        model = random_model(shape, Path(folder), max(longest, 512))
        group = cfg.rollout.group_size
        cfg = load_trial_spec(
            spec,
            [
                f"model.path={model}",
                "learner.num_workers=1",
                "rollout.num_engines=1",
                "learner.prompts_per_step=1",
                f"learner.use_gpu={str(not cpu).lower()}",
                "model.config_overrides={}",
            ],
            check_files=False,
        )
        learner = Learner(model, cfg, world_size=1, device="cpu" if cpu else "cuda")
    batch, rewards = synthetic_group(shape.vocab, group, PROMPT_TOKENS[cfg.task.name], longest)
    logp_old = torch.full(batch.response_mask.shape, -1.0)
    watched(learner, peaks)
    start = time.perf_counter()
    for _ in range(2):  # the second update is the steady state: the optimizer's states exist
        peaks.seen.clear()
        peaks.start()
        learner.rl_update(batch, rewards, logp_old)
    peaks.start()
    push(learner, cfg.rollout.weight_transfer, cfg.rollout.weight_bucket_mb * 2**20, learner.device)
    peaks.stop("weight push")
    seconds = time.perf_counter() - start
    estimates = preflight_phases(cfg, shape, cpu)
    name = "CPU" if cpu else torch.cuda.get_device_name(0)
    dist.destroy_process_group()
    return {
        "device": name,
        "spec": spec,
        "tokens": micro_batch_tokens(cfg),
        "seconds": seconds,
        "phases": {
            p: {"measured_gib": peaks.seen.get(p, 0) / GIB, "preflight_gib": estimates[p] / GIB} for p in PHASES
        },
    }


def print_table(result: dict) -> None:
    print(
        f"\ngpu memory of one learner rank on {result['device']}: {result['spec']}, micro-batches of "
        f"{result['tokens']} tokens, two updates and a push in {result['seconds']:.0f} s"
    )
    print(f"{'phase':<16}{'measured GiB':>14}{'pre-flight GiB':>16}{'measured / pre-flight':>24}")
    for phase, row in result["phases"].items():
        ratio = (
            f"{row['measured_gib'] / row['preflight_gib']:.2f}"
            if result["device"] != "CPU"
            else "- (CPU: the process's own)"
        )
        print(f"{phase:<16}{row['measured_gib']:>14.2f}{row['preflight_gib']:>16.2f}{ratio:>24}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python infra/gpu_memory.py",
        description=__doc__.strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("spec", nargs="?", help=f"a trial spec (default {PAPER_SPEC}; --cpu: {CPU_SPEC})")
    parser.add_argument("--cpu", action="store_true", help="the CPU path at the tiny preset's shapes")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    result = run(args.spec or (CPU_SPEC if args.cpu else PAPER_SPEC), args.cpu)
    print_table(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
