"""The learner's passes (old log-probs + one update), measured with the project's own `Learner` in fresh
processes (one rank, DeepSpeed ZeRO-0, fp32), each pass as it is and as the straightforward full-logits
pass (`learner.logits_chunk_tokens: null`), side by side:

  memory  peak memory per response token over the size of one fp32 logits row (4 V bytes) at the
          Qwen2.5 vocabulary, V = 151,936, on a 2-layer body: the slope between 512 and 1024 response
          tokens of a micro-batch of 2 sequences (chunks of 256 positions);
  speed   tokens per second of old log-probs + update on the embedded default's policy and rollouts,
          chunked over full, in alternating paired rounds (interquartile mean of the per-round ratios).

  push    the weight push's peak memory beyond the learner's states, over the model's size, on a
          24-layer body under ZeRO-3 sending over gloo to a receiving process in 4 MiB buckets: a bucket
          at a time from the partitions (the push as trials run it) and, side by side, the whole model
          gathered and copied first (the push before).

python -m bench.learner_costs memory|speed|push JSON runs one measurement and prints its figures as JSON.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

QWEN25_VOCAB = 151_936
MEMORY_CHUNK = 256  # positions per logits chunk in the memory row
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}  # freed tensors leave RSS


def _status_bytes(field: str) -> int:
    """A field of this process's /proc status in bytes: VmHWM (this address space's high-water mark) or VmRSS."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(f"{field}:"))


def _peak_rss() -> int:
    return _status_bytes("VmHWM")


def _learner(model_path: str, trial: dict):
    """A one-rank Learner in this process (DeepSpeed over a gloo group of one)."""
    from trainables.config import TrialConfig
    from trainables.learner import Learner
    from trainables.rollout.weight_sync import free_port

    os.environ.update(
        {
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port("127.0.0.1")),
        }
    )
    return Learner(model_path, TrialConfig.model_validate(trial), world_size=1)


def _random_batch(rows: int, prompt: int, response: int, vocab: int):
    import torch

    from trainables.learner import build_train_batch
    from trainables.rollout.types import RolloutBatch

    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(vocab, (prompt,), generator=gen).tolist()]
    responses = [torch.randint(vocab, (response,), generator=gen).tolist() for _ in range(rows)]
    rollouts = RolloutBatch(prompts, responses, [[-1.0] * response] * rows, [""] * rows, ["length"] * rows, n=rows)
    return build_train_batch(rollouts, pad_id=0)


def _one_step(learner, batch) -> float:
    """Old log-probs + the RL update of one group with spread rewards (seconds)."""
    import torch

    start = time.perf_counter()
    logp_old, _ = learner.old_logprobs(batch)
    learner.rl_update(batch, torch.linspace(0, 1, batch.size).view(1, -1), logp_old)  # [1, B]
    return time.perf_counter() - start


def measure_memory(spec: dict) -> dict:
    """Subprocess: peak RSS of old log-probs + update over the RSS after the Learner was built."""
    learner = _learner(spec["model"], spec["trial"])
    batch = _random_batch(2, 16, spec["response"], QWEN25_VOCAB)
    base = _peak_rss()
    _one_step(learner, batch)
    return {"peak_bytes": _peak_rss() - base}


def measure_speed(spec: dict) -> dict:
    """Subprocess: paired rounds of the two passes on the same learner and rollouts."""
    import torch

    from trainables.config import DecodingConfig
    from trainables.learner import build_train_batch
    from trainables.rollout.hf import HFEngine
    from trainables.tasks import encode_prompt, train_problems

    learner = _learner(spec["model"], spec["trial"])
    cfg = learner.cfg
    engine = HFEngine(spec["model"])
    prompts = [encode_prompt(engine.tokenizer, p) for p in train_problems(cfg)[: cfg.learner.prompts_per_step]]
    at_one = DecodingConfig(schedule="fixed").sampling(cfg.rollout.max_new_tokens, step=0, seed=1)
    rollouts = engine.generate(prompts, cfg.rollout.group_size, at_one)
    batch = build_train_batch(rollouts, engine.tokenizer.pad_token_id)
    torch.set_num_threads(1)
    chunk, ratios = cfg.learner.logits_chunk_tokens, []
    _one_step(learner, batch)  # warm-up
    for round_ in range(spec["rounds"]):
        seconds = {}
        for mode in ("full", "chunked") if round_ % 2 else ("chunked", "full"):  # alternating order
            learner.cfg.learner.logits_chunk_tokens = None if mode == "full" else chunk
            seconds[mode] = _one_step(learner, batch)
        ratios.append(seconds["full"] / seconds["chunked"])  # tokens/s chunked over full: same tokens
    return {"ratios": ratios, "tokens": rollouts.num_tokens}


def _receive(port: int, plan) -> None:
    """The engine's side of `measure_push`, in its own process: every bucket received, then dropped."""
    from trainables.rollout.weight_sync import gloo_group, receive_buckets

    group = gloo_group("127.0.0.1", port, 1, 2, timeout_s=120)
    for _ in receive_buckets(plan, group=group):
        pass


def measure_push(spec: dict) -> dict:
    """Subprocess: the push's peak RSS over the RSS before it (the high-water mark reset), and its seconds."""
    import multiprocessing

    from trainables.rollout.push import GlooPush, learner_weights
    from trainables.rollout.weight_sync import Weights, free_port, gloo_group, send_buckets

    learner = _learner(spec["model"], spec["trial"])
    push = GlooPush([], spec["bucket_bytes"])
    weights = learner_weights(learner, push, "cpu")
    plan = weights.plan()
    port = free_port("127.0.0.1")
    receiver = multiprocessing.get_context("spawn").Process(target=_receive, args=(port, plan))
    receiver.start()
    group = gloo_group("127.0.0.1", port, 0, 2, timeout_s=120)
    with open("/proc/self/clear_refs", "w") as refs:  # the high-water mark from here on
        refs.write("5")
    base, start = _status_bytes("VmRSS"), time.perf_counter()
    if spec["whole"]:  # the push before: the whole model gathered and copied, then sent in buckets
        weights = Weights.of(learner.full_state_dict(), spec["bucket_bytes"])
    send_buckets(weights.buckets, plan, group=group)
    seconds = time.perf_counter() - start
    receiver.join()
    model_bytes = sum(m.nbytes for m in weights.metas)
    return {"extra_bytes": _peak_rss() - base, "model_bytes": model_bytes, "seconds": seconds}


def _run(kind: str, spec: dict) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "bench.learner_costs", kind, json.dumps(spec)],
        capture_output=True,
        text=True,
        env={**os.environ, **MALLOC_ENV},
    )
    if out.returncode:
        raise SystemExit(f"bench: the learner's {kind} measurement failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _wide_vocab_model(folder: str) -> str:
    """A 2-layer Qwen2 body with Qwen2.5's vocabulary, so that the logits dominate (random weights)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        hidden_size=128,
        num_hidden_layers=2,
        intermediate_size=384,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=QWEN25_VOCAB,
        tie_word_embeddings=True,
        max_position_embeddings=2048,
    )
    Qwen2ForCausalLM(config).save_pretrained(folder)
    return folder


def _deep_model(folder: str) -> str:
    """A 24-layer Qwen2 body with a small vocabulary (312 MB in fp32, random weights): many buckets, none
    forced large by the embedding."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        hidden_size=512,
        num_hidden_layers=24,
        intermediate_size=1536,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=4096,
        tie_word_embeddings=True,
        max_position_embeddings=2048,
    )
    Qwen2ForCausalLM(config).save_pretrained(folder)
    return folder


def push_figures(cfg) -> dict:
    """The push's peak memory over the model's size, by buckets and by a whole copy, side by side."""
    trial = cfg.model_dump(mode="json")
    trial["learner"] |= {"num_workers": 1, "zero_stage": 3}
    with tempfile.TemporaryDirectory() as folder:
        model = _deep_model(folder)
        figures = {
            name: _run("push", {"model": model, "trial": trial, "bucket_bytes": 4 * 2**20, "whole": whole})
            for name, whole in (("buckets", False), ("whole", True))
        }
    for figure in figures.values():
        figure["extra_over_model"] = figure["extra_bytes"] / figure["model_bytes"]
    return figures


def interquartile_mean(values: list[float]) -> float:
    ordered = sorted(values)
    quarter = len(ordered) // 4
    return statistics.fmean(ordered[quarter : len(ordered) - quarter] or ordered)


def learner_figures(cfg, quick: bool, tiny_model: str) -> dict:
    """Both rows' figures; `cfg` is the spec's trial (its learner settings, as a one-rank ZeRO-0 learner)."""
    base = cfg.model_dump(mode="json")
    base["learner"] |= {"num_workers": 1, "zero_stage": 0}
    figures = {}
    with tempfile.TemporaryDirectory() as folder:
        model = _wide_vocab_model(folder)
        # Chunks of 256 positions, so that both lengths fill several: past one chunk, what grows with the
        # response is what each token keeps (activations, a few floats), not the chunk filling up.
        for name, chunk in (("full", None), ("chunked", MEMORY_CHUNK)):
            trial = {**base, "learner": {**base["learner"], "logits_chunk_tokens": chunk, "micro_batch_size": 2}}
            peaks = {
                t: _run("memory", {"model": model, "trial": trial, "response": t})["peak_bytes"] for t in (512, 1024)
            }
            per_token = (peaks[1024] - peaks[512]) / (2 * 512)  # 2 sequences, 512 more tokens each
            figures[name] = {"peaks": peaks, "per_token_over_logits_row": per_token / (4 * QWEN25_VOCAB)}
    speed = _run("speed", {"model": tiny_model, "trial": base, "rounds": 4 if quick else 12})
    figures["speed"] = speed | {"chunked_over_full": interquartile_mean(speed["ratios"])}
    return figures


if __name__ == "__main__":
    kind, spec = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps({"memory": measure_memory, "speed": measure_speed, "push": measure_push}[kind](spec)))
