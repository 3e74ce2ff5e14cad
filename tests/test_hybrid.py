"""The hybrid groups of luffy / oger*: real tokenizer, real verifier, real packaged encoder."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from trainables.algo.algorithms import ALGORITHMS
from trainables.algo.hybrid import mix_teachers, teacher_response
from trainables.data.arithmetic import TEACHERS, make_splits, teacher_solution
from trainables.data.offline import build_store, builtin_rows
from trainables.rewards.embed import TrajectoryEncoder
from trainables.rewards.verify import score_batch
from trainables.rollout.types import RolloutBatch

N, K = 4, 1


@pytest.fixture(scope="module")
def setup(tiny_model_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    problems, _ = make_splits(11, [1], train_size=3, val_size=0)
    store = build_store(
        builtin_rows(problems[:2], seed=0, wrong_rate=0.0, overlong_rate=0.0),
        count_tokens=lambda t: len(tokenizer(t)["input_ids"]) + 1,
        max_tokens=64,
    )
    rng = np.random.default_rng(0)
    texts, golds = [], []
    for p in problems:  # per prompt: two correct answers in different styles, two wrong ones
        right = [teacher_solution(t, p, rng, wrong_rate=0.0, overlong_rate=0.0)[0] for t in ("terse", "verbose")]
        wrong = [f"<think>{p.question}=?</think>\\boxed{{{int(p.answer) + d}}}" for d in (1, 2)]
        texts += right + wrong
        golds.append(p.answer)
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    rollouts = RolloutBatch(
        prompt_ids=[[1, 2]] * len(problems),
        response_ids=ids,
        behaviour_logprobs=[[-0.5] * len(r) for r in ids],
        texts=texts,
        finish_reasons=["stop"] * len(texts),
        n=N,
    )
    verifiable = torch.tensor(score_batch(texts, [g for g in golds for _ in range(N)])[0])
    encoder = TrajectoryEncoder()

    def embed(online, keys):
        return encoder.encode(online), {
            k: encoder.encode([t.text for t in store.for_prompt(k)]) for k in keys if store.for_prompt(k)
        }

    return dict(
        rollouts=rollouts,
        keys=[p.question for p in problems],
        golds=golds,
        verifiable=verifiable,
        last_entropy=torch.tensor([0.0, 0.5, 0.1, 0.2] * len(problems)),
        store=store,
        embed=embed,
        tokenizer=tokenizer,
    )


def run(setup, name: str):
    s = setup

    def score(texts, golds):
        return torch.tensor(score_batch(texts, golds)[0])

    preset = ALGORITHMS[name]
    embeddings = s["embed"](s["rollouts"].texts, s["keys"]) if preset.needs_embeddings else None
    return mix_teachers(
        s["rollouts"],
        s["keys"],
        s["golds"],
        s["verifiable"],
        s["last_entropy"],
        embeddings,
        preset=preset,
        k=K,
        store=s["store"],
        score=score,
        to_response=lambda text: teacher_response(text, s["tokenizer"], 64),
        rng=np.random.default_rng(7),
    )


def test_oger_and_oger_no_reward_differ_only_by_the_exploration_reward(setup):
    oger, plain = run(setup, "oger"), run(setup, "oger_no_reward")
    assert torch.equal(oger.offpolicy, plain.offpolicy)
    assert oger.rollouts.texts == plain.rollouts.texts  # same members replaced, by the same teachers
    gain = oger.rewards - plain.rewards
    with_data = torch.arange(len(gain)) < 2 * N  # the third prompt has no offline trajectories
    online_correct = ~oger.offpolicy & (setup["verifiable"] > 0) & with_data
    assert (gain[~online_correct] == 0).all()  # wrong answers, teacher members, no data: R_m only
    assert (gain[online_correct] > 0).all() and (gain[online_correct] < 1).all()
    assert oger.metrics["oger_exploration"] == pytest.approx(float(gain.sum()), abs=1e-5)


def test_the_replaced_member_is_the_least_divergent_one(setup):
    oger = run(setup, "oger")
    online_emb, offline = setup["embed"](setup["rollouts"].texts, setup["keys"][:2])
    for g, key in enumerate(setup["keys"][:2]):
        rows = slice(g * N, (g + 1) * N)
        a = torch.nn.functional.normalize(online_emb[rows], dim=-1)
        b = torch.nn.functional.normalize(offline[key], dim=-1)
        divergence = 1 - (a @ b.T).mean(1)
        replaced = oger.offpolicy[rows].nonzero().flatten().tolist()
        assert replaced == [int(divergence.argmin())]


def test_teacher_members_are_scored_tokenised_and_flagged(setup):
    hybrid = run(setup, "luffy")
    n_groups_with_data = 2  # the third prompt has no offline trajectories
    assert hybrid.offpolicy.tolist() == [False] * 3 + [True] + [False] * 3 + [True] + [False] * 4  # last slot
    assert hybrid.metrics["no_offline_groups"] == 1 and hybrid.metrics["replaced"] == n_groups_with_data * K
    for row in hybrid.offpolicy.nonzero().flatten().tolist():
        assert hybrid.rewards[row] == 1.0  # the store keeps correct teachers only
        assert hybrid.rollouts.response_ids[row][-1] == setup["tokenizer"].eos_token_id
        assert hybrid.rollouts.texts[row].startswith("<think>")
    online = ~hybrid.offpolicy
    assert torch.equal(hybrid.rewards[online], setup["verifiable"][online])  # luffy: no exploration reward
    assert set(TEACHERS) >= {t.teacher for k in setup["keys"][:2] for t in setup["store"].for_prompt(k)}
