"""Generation costs, side by side in one process on one batch: EAD against a fixed temperature (per
backend), the rollout service actor against the same engine called in this process, and the weight
push to the service through Ray's object store against a gloo broadcast.

The batch is one learner rank's share of a step of the spec (its prompts x group size, its token cap).
Variants alternate call by call on the same seeds; a ratio is the interquartile mean over rounds of
the ratio within a round, so a noisy neighbour or a drift of the machine's speed hits both sides of it.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

from trainables.config import TrialConfig
from trainables.data.models import resolve_model_path
from trainables.rollout.types import RolloutBatch, SamplingSpec
from trainables.tasks import encode_prompt, train_problems


def workload(cfg: TrialConfig) -> tuple[str, list[list[int]], int, dict[str, SamplingSpec]]:
    """(model folder, one rank's prompts, n, the samplings compared): `fixed` T = 1; `ead` the spec's
    EAD recipe (hotter, so longer responses: its cost per token also pays for the length); `ead_t1`
    the same EAD code path with the warm-up over every token, so tau = 1 and the very tokens of
    `fixed` are sampled: the cost of EAD itself."""
    from transformers import AutoTokenizer

    model_path = str(resolve_model_path(cfg.model, cfg.cache_dir))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    per_rank = cfg.prompts_per_rank
    prompts = [encode_prompt(tokenizer, p) for p in train_problems(cfg)[:per_rank]]
    ead = cfg.rollout.decoding.sampling(cfg.rollout.max_new_tokens, step=0, seed=cfg.seed)
    if ead.schedule != "ead":
        ead = replace(ead, schedule="ead", params=cfg.rollout.decoding.ead.model_dump())
    fixed = replace(ead, schedule="fixed", params={"temperature": 1.0})
    ead_t1 = replace(ead, params={**ead.params, "warmup_tokens": ead.max_new_tokens})
    # fixed and ead_t1 next to each other: the two calls of their ratio follow one another
    return model_path, prompts, cfg.rollout.group_size, {"fixed": fixed, "ead_t1": ead_t1, "ead": ead}


def seconds_per_token(generate, prompts, n, spec: SamplingSpec, per: str) -> float:
    """Wall seconds of one call over its tokens: generated ones (`per="token"`, engines that batch
    continuously) or decode steps, the longest response (`per="step"`: a static batch runs to it)."""
    start = time.perf_counter()
    batch: RolloutBatch = generate(prompts, n, spec)
    seconds = time.perf_counter() - start
    lengths = [len(r) for r in batch.response_ids]
    return seconds / max(sum(lengths) if per == "token" else max(lengths), 1)


def interleaved(measures: dict, repeats: int) -> dict[str, list[float]]:
    """Each measure {name: f(round) -> value}, called round by round in turn: {name: a value per round}.
    Odd rounds go in reverse order, so no measure always follows the same one. The first round warms
    caches (and forms groups) and is dropped."""
    samples: dict[str, list[float]] = {name: [] for name in measures}
    for round_ in range(repeats + 1):
        for name in list(measures)[:: -1 if round_ % 2 else 1]:
            value = measures[name](round_)
            if round_:
                samples[name].append(value)
    return samples


def paired_ratio(samples: dict[str, list[float]], a: str, b: str) -> float:
    """Interquartile mean over rounds of a / b within a round. This machine's speed drifts by tens of
    percent over seconds; the two calls of a round, made one after the other on the same seed, share
    it. The middle half of the ratios: a stray slow call does not move it, and it averages more of the
    rounds than a median does."""
    middle = sorted(x / y for x, y in zip(samples[a], samples[b]))
    cut = len(middle) // 4
    return statistics.fmean(middle[cut : len(middle) - cut])


def side_by_side(variants: dict, prompts, n, repeats: int, per: str) -> dict[str, list[float]]:
    """Seconds per token of each variant {name: (generate, spec)} per round, calls interleaved; every
    variant of a round samples with the same seed."""
    return interleaved(
        {
            name: lambda round_, generate=generate, spec=spec: seconds_per_token(
                generate, prompts, n, replace(spec, seed=spec.seed + round_), per
            )
            for name, (generate, spec) in variants.items()
        },
        repeats,
    )


def ratios(per_token: dict[str, list[float]]) -> dict:
    return {
        "ead_over_fixed": paired_ratio(per_token, "ead_t1", "fixed"),
        "ead_recipe_over_fixed": paired_ratio(per_token, "ead", "fixed"),
        "seconds_per_token": per_token,
    }


def hf_figures(cfg: TrialConfig, repeats: int) -> dict:
    """HF engine: EAD / fixed, and the service actor's throughput over the in-process engine's."""
    import ray
    import torch

    from orchestrator.launch import init_ray, logical_cpus
    from trainables.rollout.hf import HFEngine
    from trainables.rollout.service import start_rollout_service

    model_path, prompts, n, specs = workload(cfg)
    threads = max(1, int(cfg.rollout.num_cpus))  # what the service actor runs with
    torch.set_num_threads(threads)
    engine = HFEngine(model_path)
    init_ray(logical_cpus(cfg))
    service = start_rollout_service(cfg.rollout, model_path)
    try:
        ray.get(service.health.remote())  # loaded before the clock starts

        def remote(p, k, spec):
            return ray.get(service.generate.remote(p, k, spec))

        per_token = side_by_side(
            {name: (engine.generate, spec) for name, spec in specs.items()}, prompts, n, repeats, per="step"
        )
        # A pair of its own, in alternating order: each side starts as often with its own caches warm
        # as with the other's (the tiny model fits in them; after the direct variants' calls in a row
        # the service would start cold every time). Twice the rounds: the noisiest row.
        served = side_by_side(
            {"direct": (engine.generate, specs["ead"]), "service": (remote, specs["ead"])},
            prompts,
            n,
            2 * repeats,
            per="step",
        )
        push = push_seconds(service, engine.model.state_dict(), cfg.rollout, repeats)
    finally:
        ray.kill(service)
    return {
        **ratios(per_token),
        # throughput ratio = inverse time ratio
        "service_over_direct": paired_ratio(served, "direct", "service"),
        "threads": threads,
        "seconds_per_token_served": served,
        "push_seconds": push,
        "gloo_over_object_store": paired_ratio(push, "gloo", "object_store"),
    }


def push_seconds(service, state: dict, rollout_cfg, repeats: int) -> dict[str, list[float]]:
    """Seconds of one full weight push to the service by each `rollout.weight_transfer` that runs
    on CPUs, interleaved (the gloo group forms in the dropped first round, as in a trial's first sync)."""
    from trainables.rollout.push import weight_push

    def timed(transfer: str):
        push = weight_push([service], rollout_cfg.model_copy(update={"weight_transfer": transfer}))

        def measure(round_: int) -> float:
            start = time.perf_counter()
            push(state, round_ + 1)
            return time.perf_counter() - start

        return measure

    return interleaved({transfer: timed(transfer) for transfer in ("object_store", "gloo")}, repeats)


def vllm_figures(cfg: TrialConfig, repeats: int) -> dict | str:
    """vLLM engine (where installed): EAD / a fixed temperature, both through the logits processor."""
    import os

    import torch

    from trainables.rollout.service import make_engine

    try:
        import vllm  # noqa: F401
    except ImportError:
        return "vllm is not installed here: run make bench-vllm (its own environment)"
    if not torch.cuda.is_available():  # the CPU build: its threads on every core, none reserved, a small KV cache
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{max(0, (os.cpu_count() or 1) - 1)}")
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
    model_path, prompts, n, specs = workload(cfg)
    engine = make_engine(cfg.rollout.model_copy(update={"backend": "vllm"}), model_path)
    return ratios(
        side_by_side({name: (engine.generate, spec) for name, spec in specs.items()}, prompts, n, repeats, per="token")
    )
