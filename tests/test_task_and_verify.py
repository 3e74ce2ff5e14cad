"""The built-in task, its teachers, and the math-verify reward."""

import ast
import operator
import random
import threading

import pytest

from trainables.data.arithmetic import LEVELS, TEACHERS, make_splits, teacher_dataset, teacher_solution
from trainables.rewards.verify import REASONS, score_batch, verify_response

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def evaluate(question: str) -> int:
    """An independent evaluator of the task's questions (precedence by Python's grammar)."""
    def walk(node):
        if isinstance(node, ast.BinOp):
            return OPS[type(node.op)](walk(node.left), walk(node.right))
        return node.value
    return walk(ast.parse(question, mode="eval").body)


def test_splits_disjoint_deterministic_and_correct():
    train, val = make_splits(3, [1, 2, 3, 4], train_size=800, val_size=100)
    assert len(train) == 800 and len(val) == 100
    assert not {p.question for p in train} & {p.question for p in val}
    assert len({p.question for p in train}) == 800
    assert {p.level for p in train} == set(LEVELS)
    assert all(evaluate(p.question) == int(p.answer) for p in train + val)
    again, _ = make_splits(3, [1, 2, 3, 4], train_size=800, val_size=100)
    other, _ = make_splits(4, [1, 2, 3, 4], train_size=800, val_size=100)
    assert again == train and other != train


def test_split_too_large_for_the_level_is_an_error():
    with pytest.raises(ValueError, match="train_size"):
        make_splits(0, [1], train_size=1000, val_size=10)


def test_teachers_are_correct_distinct_and_ordered_by_length():
    train, _ = make_splits(0, [1, 2, 3, 4], train_size=200, val_size=1)
    lengths = {}
    for name, teacher in TEACHERS.items():
        texts = [teacher(p) for p in train]
        assert all(verify_response(t, p.answer).reward == 1.0 for t, p in zip(texts, train)), name
        lengths[name] = sum(map(len, texts)) / len(texts)
    assert lengths["terse"] < lengths["stepwise"] < lengths["verbose"]


def test_wrong_and_overlong_solutions_and_their_rates():
    train, _ = make_splits(0, [1, 2], train_size=700, val_size=1)
    rows = teacher_dataset(train, 5, wrong_rate=0.1, overlong_rate=0.1)  # 2,100 rows
    kinds = [r["kind"] for r in rows]
    assert 0.07 < kinds.count("wrong") / len(rows) < 0.13
    assert 0.07 < kinds.count("overlong") / len(rows) < 0.13
    for row in rows[:300]:
        normal = TEACHERS[row["teacher"]](next(p for p in train if p.uid == row["uid"]))
        reward = verify_response(row["solution"], row["answer"]).reward
        if row["kind"] == "wrong":
            assert reward == 0.0
        else:
            assert reward == 1.0
        if row["kind"] == "overlong":
            assert len(row["solution"]) > 4 * len(normal)
    with pytest.raises(ValueError, match="wrong_rate"):
        teacher_solution("terse", train[0], random.Random(0), wrong_rate=1.5, overlong_rate=0.0)


@pytest.mark.parametrize(
    "response, gold, reason",
    [
        ("<think>3 of 4</think>\\boxed{3/4}", "0.75", "correct"),
        ("<think>x</think>The answer is \\boxed{-12}.", "-12", "correct"),
        ("\\boxed{7}", "7", "no_think"),
        ("<think>7</think>so 7", "7", "no_boxed"),
        ("<think>\\boxed{7}</think>", "7", "no_boxed"),  # the answer must come after </think>
        ("<think>x</think>\\boxed{8}", "7", "wrong"),
        ("<think>x</think>\\boxed{\\frac{", "7", "parse_error"),
    ],
)
def test_verifier_cases(response, gold, reason):
    verdict = verify_response(response, gold)
    assert verdict.reason == reason
    assert verdict.reward == (1.0 if reason == "correct" else 0.0)


def test_verifier_works_off_the_main_thread():
    results = []
    thread = threading.Thread(target=lambda: results.append(verify_response("<think>a</think>\\boxed{5}", "5")))
    thread.start()
    thread.join()
    assert results[0].reason == "correct"


def test_score_batch_counts_every_reason():
    rewards, counts = score_batch(["<think>a</think>\\boxed{1}", "nothing"], ["1", "1"])
    assert rewards == [1.0, 0.0]
    assert set(counts) == set(REASONS) and counts["correct"] == 1 and counts["no_think"] == 1
    with pytest.raises(ValueError):
        score_batch(["a"], [])
