"""The learner's token columns line up with the rollout engine's sampled log-probs; data parallelism
changes no update; the weight push, a bucket at a time from the ZeRO partitions, lands bit for bit."""

from __future__ import annotations

import pytest
import torch

from trainables.config import TrialConfig
from trainables.data.arithmetic import make_splits
from trainables.learner import build_train_batch, last_token_index
from trainables.rollout.hf import HFEngine
from trainables.rollout.types import RolloutBatch, SamplingSpec
from trainables.tasks import encode_prompt

PROMPTS, GROUP = 4, 4


@pytest.fixture(scope="module")
def rollouts(tiny_model_path) -> RolloutBatch:
    engine = HFEngine(tiny_model_path)
    train, _ = make_splits(0, [1], train_size=PROMPTS, val_size=1)
    prompts = [encode_prompt(engine.tokenizer, p) for p in train]
    return engine.generate(prompts, GROUP, SamplingSpec("fixed", {"temperature": 1.0}, 24, seed=5))


def test_behaviour_logprobs_match_the_learner_at_temperature_one(rollouts, tiny_model_path):
    """At T = 1 the sampler's log-probs equal a recomputation: the token columns line up."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    batch = build_train_batch(rollouts, pad_id=0)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    logp = logits.log_softmax(-1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    diff = (logp - batch.behaviour_logp).abs()[batch.response_mask]
    assert diff.max() < 1e-4
    last = last_token_index(batch.response_mask)
    lengths = torch.tensor([len(r) for r in rollouts.response_ids])
    assert torch.equal(batch.response_mask.sum(1), lengths)
    assert all(
        batch.response_mask[i, last[i]] and not batch.response_mask[i, last[i] + 1 :].any() for i in range(batch.size)
    )


def pass_only(cfg: TrialConfig):
    """A Learner with only what its forward passes read (no DeepSpeed engine)."""
    from trainables.learner import Learner

    learner = Learner.__new__(Learner)
    learner.cfg, learner.device, learner.engine = cfg, "cpu", None
    return learner


@pytest.mark.parametrize("chunk", [1, 5, 4096])
def test_chunked_passes_equal_the_full_logits_pass(rollouts, tiny_model_path, chunk):
    """logits_chunk_tokens: log-probs, entropy and their gradients equal the straightforward [B, T, V] pass
    (logits_chunk_tokens: null) at the response positions, tempered or not."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    batch = build_train_batch(rollouts, pad_id=0, taus=tuple(0.5 + 0.05 * t for t in range(24)))
    mask = batch.response_mask
    results = {}
    for name, tokens in (("chunked", chunk), ("full", None)):
        cfg = TrialConfig.model_validate({"learner": {"logits_chunk_tokens": tokens}})
        model.zero_grad()
        logp, entropy = pass_only(cfg)._forward(model, batch, "grad")
        (logp[mask].sum() + 0.1 * entropy[mask].sum()).backward()
        results[name] = (
            logp[mask].detach(),
            entropy[mask].detach(),
            {k: p.grad.clone() for k, p in model.named_parameters()},
        )
    torch.testing.assert_close(results["chunked"][0], results["full"][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results["chunked"][1], results["full"][1], rtol=1e-5, atol=1e-5)
    for key, grad in results["full"][2].items():
        # Summation order: chunks add a tensor's gradient in another order, an error of the tensor's
        # scale, not of each element's (one element of 44,928 was 1.2e-5 off on an AMD EPYC, AVX2).
        torch.testing.assert_close(results["chunked"][2][key], grad, rtol=1e-4, atol=1e-4 * float(grad.abs().max()))


def test_learner_at_the_rollout_temperature_is_on_policy(tiny_model_path):
    """`algorithm.logprob_temperature: rollout`: at a fixed T = 0.6 the learner's pass divides the logits by
    0.6, recomputes the sampler's log-probs, and TIS weights are 1 (to float rounding between the engine's
    cached decode and the learner's full pass); at T = 1 the same rollouts are off-policy."""
    from transformers import AutoModelForCausalLM

    from trainables.algo.losses import tis_weights
    from trainables.rollout.ead import tau_table

    engine = HFEngine(tiny_model_path)
    train, _ = make_splits(0, [1], train_size=PROMPTS, val_size=1)
    spec = SamplingSpec("fixed", {"temperature": 0.6}, 24, seed=7)
    rollouts = engine.generate([encode_prompt(engine.tokenizer, p) for p in train], GROUP, spec)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    weights = {}
    for name, taus in (
        ("rollout", tau_table(spec.schedule, spec.params, spec.step, spec.max_new_tokens)),
        ("1.0", None),
    ):
        batch = build_train_batch(rollouts, pad_id=0, taus=taus)
        with torch.no_grad():
            logp, _ = pass_only(TrialConfig())._forward(model, batch)  # the learner's own pass
        weights[name] = tis_weights(logp, batch.behaviour_logp, 2.0, mask=batch.response_mask)[batch.response_mask]
    assert (weights["rollout"] - 1).abs().max() < 1e-4
    assert (weights["1.0"] - 1).abs().max() > 0.1


def one_update(config: dict) -> None:
    """Ray Train worker: one optimizer step on this rank's shard of a fixed global batch; with "engines",
    then the trial's weight push to them (`RolloutClient.sync`: every rank makes each bucket, rank 0
    sends it)."""
    import ray.train

    from trainables.learner import Learner

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    full: RolloutBatch = config["rollouts"]
    prompts = len(full.prompt_ids) // world
    rows = slice(rank * prompts * GROUP, (rank + 1) * prompts * GROUP)  # this rank's whole groups
    shard = RolloutBatch(
        full.prompt_ids[rank * prompts : (rank + 1) * prompts],
        full.response_ids[rows],
        full.behaviour_logprobs[rows],
        full.texts[rows],
        full.finish_reasons[rows],
        n=GROUP,
    )
    learner = Learner(config["model_path"], TrialConfig.model_validate(config["trial"]), world_size=world)
    batch = build_train_batch(shard, pad_id=0)
    logp_old, _ = learner.old_logprobs(batch)
    learner.update(batch, config["advantages"][rows], logp_old, torch.ones_like(logp_old))
    if config.get("engines"):
        from trainables.rollout.client import RolloutClient

        RolloutClient(config["engines"], learner.cfg.rollout, learner, trial="push", rank=rank, timeout_s=60).sync()
    state = learner.full_state_dict()  # every rank calls it (a collective under ZeRO-3)
    if rank == 0:
        torch.save(state, config["out"])


@pytest.mark.slow
def test_one_and_two_workers_give_the_same_weights(ray_cluster, rollouts, tiny_model_path, tmp_path):
    """The loss is normalised by GLOBAL counts: micro-batching and data parallelism change nothing."""
    from transformers import AutoModelForCausalLM

    lr = 1e-3
    advantages = torch.randn(PROMPTS * GROUP, generator=torch.Generator().manual_seed(0))
    weights = {}
    # 16 sequences: 1 rank x 4 micro-batches of 4, or 2 ranks x 2 micro-batches of 4; then 2 ranks under ZeRO-3
    # with micro-batches sized by tokens (as many on each rank), gradient checkpointing and logits chunks of 7.
    runs = {
        1: {"zero_stage": 2},
        2: {"zero_stage": 2},
        "tokens": {
            "zero_stage": 3,
            "max_tokens_per_micro_batch": 90,
            "gradient_checkpointing": True,
            "logits_chunk_tokens": 7,
        },
    }
    for run, options in runs.items():
        world = 1 if run == 1 else 2
        trial = TrialConfig.model_validate(
            {
                "rollout": {"group_size": GROUP, "max_new_tokens": 24},
                "learner": {
                    "num_workers": world,
                    "prompts_per_step": PROMPTS,
                    "micro_batch_size": 4,
                    "lr": lr,
                    **options,
                },
            }
        )
        weights[run] = train_once(
            f"dp-{run}",
            trial,
            {"rollouts": rollouts, "model_path": str(tiny_model_path), "advantages": advantages},
            tmp_path,
        )
    before = AutoModelForCausalLM.from_pretrained(tiny_model_path).state_dict()
    moved = max((weights[1][k] - before[k]).abs().max().item() for k in before)
    # Adam's first step moves a weight by up to lr; summation order may differ in the last bits.
    assert moved > 0.5 * lr, moved
    apart = max((weights[2][k] - weights[1][k]).abs().max().item() for k in before)
    assert apart < 1e-2 * lr, f"1 vs 2 workers differ by {apart:.2e} (the update moved weights by {moved:.2e})"
    # Regrouped rows and ZeRO-3's partitioned sums change the gradients' summation order. Adam's first step is
    # lr g / (|g| + eps): where |g| is near eps = 1e-8, a last-bit change of g moves the step by a part of lr.
    # Measured: 4 of 878,464 weights past 1e-2 lr, by at most 0.04 lr (ZeRO-3 alone, before this change: the same 4).
    apart = torch.cat([(weights["tokens"][k] - weights[1][k]).abs().flatten() for k in before])
    assert int((apart > 1e-2 * lr).sum()) <= 1e-4 * apart.numel() and apart.max() < 0.1 * lr, apart.max()


def train_once(name: str, trial: TrialConfig, config: dict, tmp_path) -> dict[str, torch.Tensor]:
    """One update on trial.learner.num_workers Ray Train workers (`one_update`); the learner's whole weights."""
    import sys

    from ray import cloudpickle
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import a test module
    out = tmp_path / f"weights-{name}.pt"
    TorchTrainer(
        one_update,
        train_loop_config={**config, "trial": trial.model_dump(mode="json"), "out": str(out)},
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=trial.learner.num_workers, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name=name, storage_path=str(tmp_path / "ray")),
    ).fit()
    return torch.load(out)


@pytest.mark.slow
def test_the_weight_push_lands_every_tensor_bit_for_bit(ray_cluster, rollouts, tiny_model_path, tmp_path):
    """After an update, the trial's push (1 MiB buckets: several per push, each made from the ZeRO
    partitions and freed) leaves in the engines exactly the learner's weights, at ZeRO-1, 2 and 3 on 1 and
    2 ranks, through Ray's object store and over gloo."""
    import ray

    from trainables.rollout.service import start_rollout_service

    runs = [(1, 2, "object_store"), (2, 1, "gloo"), (3, 2, "gloo")]  # every ZeRO stage, 1 and 2 ranks, each transfer
    initial = HFEngine(tiny_model_path).model.state_dict()
    assert sum(t.numel() * t.element_size() for t in initial.values()) > 3 * 2**20  # more than 3 buckets
    for zero, world, transfer in runs:
        rollout = {"group_size": GROUP, "max_new_tokens": 24, "weight_transfer": transfer, "weight_bucket_mb": 1}
        trial = TrialConfig.model_validate(
            {
                "rollout": rollout,
                "learner": {
                    "num_workers": world,
                    "prompts_per_step": PROMPTS,
                    "micro_batch_size": 4,
                    "lr": 1e-3,
                    "zero_stage": zero,
                },
            }
        )
        engines = [start_rollout_service(trial.rollout, tiny_model_path) for _ in range(2)]
        learner = train_once(
            f"push-{zero}-{world}-{transfer}",
            trial,
            {
                "rollouts": rollouts,
                "model_path": str(tiny_model_path),
                "engines": engines,
                "advantages": torch.randn(PROMPTS * GROUP, generator=torch.Generator().manual_seed(zero)),
            },
            tmp_path,
        )
        assert any(not torch.equal(learner[k], initial[k]) for k in initial)  # the update moved the weights
        for engine in engines:
            held = ray.get(engine.__ray_call__.remote(lambda service: service.engine.model.state_dict()))
            assert list(held) == list(learner), (zero, world, transfer)
            for name, tensor in learner.items():
                assert torch.equal(held[name], tensor), (zero, world, transfer, name)
            ray.kill(engine)


FUSED = r"""
import json, sys
import torch
from bench.learner_costs import _learner
from trainables.config import DecodingConfig
from trainables.learner import build_train_batch
from trainables.rollout.ead import tau_table
from trainables.rollout.hf import HFEngine
from trainables.data.arithmetic import make_splits
from trainables.tasks import encode_prompt

model, schedule, micro = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.manual_seed(0)
engine = HFEngine(model)
with torch.no_grad():  # the sampler's weights a little off the learner's: TIS weights that are not all 1
    for parameter in engine.model.parameters():
        parameter += 0.02 * torch.randn_like(parameter)
train, _ = make_splits(0, [1], train_size=4, val_size=1)
decoding = DecodingConfig(schedule=schedule, temperature=0.7)
spec = decoding.sampling(24, step=3, seed=5)
rollouts = engine.generate([encode_prompt(engine.tokenizer, p) for p in train], 4, spec)
taus = tau_table(spec.schedule, spec.params, spec.step, spec.max_new_tokens)
trial = {"learner": {"num_workers": 1, "prompts_per_step": 4, "micro_batch_size": micro, "lr": 1e-3},
         "rollout": {"group_size": 4, "max_new_tokens": 24, "decoding": decoding.model_dump(mode="json")},
         "algorithm": {"entropy_coef": 0.01}}
rewards = torch.linspace(0, 1, 16).view(4, 4)
out = {}
learner = _learner(model, trial)
for path in ("two passes", "fused"):  # the same initial weights: the first path's update is undone below
    start = {k: v.clone() for k, v in learner.full_state_dict().items()}
    batch = build_train_batch(rollouts, engine.tokenizer.pad_token_id, taus)
    logp_old = learner.old_logprobs(batch)[0] if path == "two passes" else None
    update = learner.rl_update(batch, rewards, logp_old)
    out[path] = {"weights": learner.full_state_dict(), "tis": update.tis, "stats": update.stats}
    learner = _learner(model, trial)  # a fresh learner (and optimizer) for the other path
print(json.dumps({
    "weights": max((out["fused"]["weights"][k] - out["two passes"]["weights"][k]).abs().max().item()
                   for k in start),
    "moved": max((out["fused"]["weights"][k] - start[k]).abs().max().item() for k in start),
    "tis": (out["fused"]["tis"] - out["two passes"]["tis"]).abs().max().item(),
    "tis_spread": out["fused"]["tis"].std().item(),
    "loss": abs(out["fused"]["stats"]["pg_loss_sum"] - out["two passes"]["stats"]["pg_loss_sum"]),
}))
"""


@pytest.mark.parametrize(("schedule", "micro"), [("ead", 16), ("ead", 4), ("fixed", 8)])
def test_old_log_probs_from_the_update_pass_give_the_same_step(tiny_model_path, schedule, micro):
    """One optimizer step per RL step: the old log-probs taken (detached) from the update's own pass give
    the TIS weights, the loss and the weights of the separate pass, to 1e-6 (EAD's per-token temperatures
    with TIS, and a fixed temperature; one micro-batch and several)."""
    import json
    import os
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", FUSED, str(tiny_model_path), schedule, str(micro)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["moved"] > 1e-4 and found["tis_spread"] > 1e-2  # the step moved the weights; TIS is not all ones
    assert found["weights"] < 1e-6 and found["tis"] < 1e-6 and found["loss"] < 1e-6, found
