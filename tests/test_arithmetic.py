"""The built-in arithmetic task and its three teachers."""

import ast
import operator
import random
import re
from collections import Counter

import pytest

from trainables.data.arithmetic import (
    LEVEL_SPACE,
    LEVELS,
    OVERLONG_FACTOR,
    TEACHERS,
    Problem,
    make_splits,
    reduce_steps,
    teacher_dataset,
    teacher_solution,
)
from trainables.rewards.verify import verify_response

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
BOXED = re.compile(r"\\boxed\{(-?\d+)\}")


def evaluate(question: str) -> int:
    """An independent evaluator of the task's questions (precedence by Python's grammar)."""

    def walk(node):
        if isinstance(node, ast.BinOp):
            return OPS[type(node.op)](walk(node.left), walk(node.right))
        assert isinstance(node, ast.Constant) and isinstance(node.value, int), ast.dump(node)
        return node.value

    return walk(ast.parse(question, mode="eval").body)


class FixedDraw(random.Random):
    """An rng whose uniform draw is fixed, so a test picks the solution kind exactly."""

    def __init__(self, draw: float):
        super().__init__(0)
        self.draw = draw

    def random(self) -> float:
        return self.draw


def problems_by_level(count: int = 60, seed: int = 0) -> dict[int, list[Problem]]:
    return {lv: make_splits(seed, [lv], train_size=count, val_size=0)[0] for lv in LEVELS}


@pytest.fixture(scope="module")
def per_level():
    return problems_by_level()


# -- splits ----------------------------------------------------------------------------------------
def test_splits_disjoint_deduplicated_sized():
    train, val = make_splits(3, [1, 2, 3, 4], train_size=800, val_size=100)
    assert len(train) == 800 and len(val) == 100
    train_q, val_q = {p.question for p in train}, {p.question for p in val}
    assert len(train_q) == 800 and len(val_q) == 100  # no repeats within a split
    assert not train_q & val_q  # none across
    assert all(p.uid == f"L{p.level}-{p.question}" for p in train + val)


def test_splits_deterministic_per_seed():
    first = make_splits(3, [1, 2], train_size=200, val_size=20)
    assert make_splits(3, [1, 2], train_size=200, val_size=20) == first
    other = make_splits(4, [1, 2], train_size=200, val_size=20)
    assert other[0] != first[0] and other[1] != first[1]


def test_levels_roughly_uniform_and_only_those_requested():
    train, val = make_splits(0, [2, 4], train_size=2000, val_size=100)
    counts = Counter(p.level for p in train + val)
    assert set(counts) == {2, 4}
    assert 0.45 < counts[2] / 2100 < 0.55


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_gold_answers_are_exact(level, per_level):
    for p in per_level[level]:
        assert p.level == level and p.answer == str(evaluate(p.question)), p


def test_level_shapes(per_level):
    for p in per_level[1]:
        a, b = map(int, p.question.split("+"))
        assert 0 <= a <= 19 and 0 <= b <= 19
    for p in per_level[2]:
        a, b = map(int, re.split(r"[+-]", p.question))
        assert 10 <= a <= 99 and 10 <= b <= 99
    assert all(re.fullmatch(r"[1-9]\*[1-9]\+\d+", p.question) for p in per_level[3])
    assert all(len(re.findall(r"[+*-]", p.question)) == 2 for p in per_level[4])
    assert any(int(p.answer) < 0 for p in per_level[4])  # a-b*c reaches below zero


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_level_space_is_exact_and_fillable(level):
    # The sampler trusts LEVEL_SPACE: a whole level must be drawable, and one more must be refused.
    train, val = make_splits(0, [level], train_size=LEVEL_SPACE[level] - 1, val_size=1)
    assert len({p.question for p in train + val}) == LEVEL_SPACE[level]
    with pytest.raises(ValueError, match="train_size"):
        make_splits(0, [level], train_size=LEVEL_SPACE[level], val_size=1)


def test_levels_do_not_share_questions():
    spaces = [{p.question for p in make_splits(1, [lv], LEVEL_SPACE[lv], 0)[0]} for lv in (1, 2)]
    assert not spaces[0] & spaces[1]


def test_used_up_level_drops_out_of_the_draw():
    # Level 1 holds 400 questions; the rest of a 1,000-problem request comes from level 3.
    train, val = make_splits(0, [1, 3], train_size=990, val_size=10)
    counts = Counter(p.level for p in train + val)
    assert counts[1] == LEVEL_SPACE[1] and counts[3] == 600


def test_bad_requests_say_what_to_fix():
    with pytest.raises(ValueError, match="train_size.*val_size.*400"):
        make_splits(0, [1], train_size=1000, val_size=10)
    with pytest.raises(ValueError, match="levels"):
        make_splits(0, [7], train_size=10, val_size=1)
    with pytest.raises(ValueError, match="levels"):
        make_splits(0, [], train_size=10, val_size=1)


def test_reduce_steps_hand_worked():
    assert reduce_steps("5+3*4") == [(3, "*", 4, 12), (5, "+", 12, 17)]
    assert reduce_steps("3-9+5") == [(3, "-", 9, -6), (-6, "+", 5, -1)]
    assert reduce_steps("9*9-20") == [(9, "*", 9, 81), (81, "-", 20, 61)]


# -- teachers --------------------------------------------------------------------------------------
def test_teacher_examples_hand_worked():
    p = Problem("L2-17+25", "17+25", "42", 2)
    assert TEACHERS["terse"](p) == "<think>17+25=42</think>\\boxed{42}"
    assert TEACHERS["stepwise"](p) == (
        "<think>17+25: 7+5=12 write 2 carry 1. 1+2+1=4. so 42.</think>The answer is \\boxed{42}."
    )
    assert TEACHERS["verbose"](p) == (
        "<think>We need 17+25. 17+20=37. 37+5=42. Check: 42-25=17. Correct.</think>So the final answer is \\boxed{42}."
    )
    q = Problem("L4-5+3*4", "5+3*4", "17", 4)  # precedence: the product first
    assert TEACHERS["terse"](q) == "<think>3*4=12. 5+12=17</think>\\boxed{17}"
    assert TEACHERS["stepwise"](Problem("L2-52-17", "52-17", "35", 2)).startswith(
        "<think>52-17: 12-7=5 borrow 1. 5-1-1=3. so 35."
    )


@pytest.mark.parametrize("name", sorted(TEACHERS))
@pytest.mark.parametrize("level", sorted(LEVELS))
def test_every_teacher_is_correct_at_every_level(name, level, per_level):
    for p in per_level[level]:
        text = TEACHERS[name](p)
        assert verify_response(text, p.answer).reason == "correct", text
        assert BOXED.findall(text) == [p.answer]


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_teacher_lengths_ordered_terse_stepwise_verbose(level, per_level):
    mean = {name: sum(len(t(p)) for p in per_level[level]) / len(per_level[level]) for name, t in TEACHERS.items()}
    assert mean["terse"] < mean["stepwise"] < mean["verbose"], mean


def test_wrong_solutions_fail_and_are_off_by_a_little(per_level):
    rng = FixedDraw(0.0)  # below wrong_rate: always wrong
    for problems in per_level.values():
        for p in problems[:20]:
            for name in TEACHERS:
                text, kind = teacher_solution(name, p, rng, wrong_rate=0.5, overlong_rate=0.0)
                assert kind == "wrong"
                assert verify_response(text, p.answer).reason == "wrong", text
                (stated,) = BOXED.findall(text)
                assert 0 < abs(int(stated) - int(p.answer)) <= 2
                # the reasoning's last step states the same wrong value
                think = text.split("</think>")[0]
                assert re.search(rf"(=|so ){re.escape(stated)}\.?( Check|$|\.)", think), text


def test_overlong_solutions_are_long_and_correct(per_level):
    rng = FixedDraw(0.5)  # past wrong_rate, below wrong_rate + overlong_rate: always over-long
    for problems in per_level.values():
        for p in problems[:20]:
            for name, teacher in TEACHERS.items():
                text, kind = teacher_solution(name, p, rng, wrong_rate=0.25, overlong_rate=0.5)
                assert kind == "overlong"
                assert len(text) > OVERLONG_FACTOR * len(teacher(p))
                assert verify_response(text, p.answer).reason == "correct"


def test_teacher_dataset_rates_rows_and_determinism():
    train, _ = make_splits(0, [1, 2, 3, 4], train_size=700, val_size=1)
    rows = teacher_dataset(train, 5, wrong_rate=0.1, overlong_rate=0.2)  # 2,100 rows
    assert len(rows) == 3 * len(train)
    assert [r["teacher"] for r in rows[:3]] == list(TEACHERS)
    assert set(rows[0]) == {"uid", "question", "answer", "teacher", "solution", "kind"}
    kinds = Counter(r["kind"] for r in rows)
    assert 0.07 < kinds["wrong"] / len(rows) < 0.13
    assert 0.16 < kinds["overlong"] / len(rows) < 0.24
    assert teacher_dataset(train, 5, wrong_rate=0.1, overlong_rate=0.2) == rows
    assert teacher_dataset(train, 6, wrong_rate=0.1, overlong_rate=0.2) != rows
    clean = teacher_dataset(train[:50], 5, teachers=("terse",), wrong_rate=0.0, overlong_rate=0.0)
    assert {r["kind"] for r in clean} == {"correct"} and {r["teacher"] for r in clean} == {"terse"}


@pytest.mark.parametrize(
    "kwargs, arg",
    [
        ({"wrong_rate": 1.5, "overlong_rate": 0.0}, "wrong_rate"),
        ({"wrong_rate": 0.0, "overlong_rate": -0.1}, "overlong_rate"),
        ({"wrong_rate": 1.0, "overlong_rate": 0.0}, "wrong_rate"),
        ({"wrong_rate": 0.6, "overlong_rate": 0.6}, "wrong_rate \\+ overlong_rate"),
    ],
)
def test_bad_rates_name_the_argument(kwargs, arg):
    p = Problem("L1-1+2", "1+2", "3", 1)
    with pytest.raises(ValueError, match=arg):
        teacher_solution("terse", p, random.Random(0), **kwargs)


def test_unknown_teacher_lists_the_choices():
    with pytest.raises(ValueError, match="stepwise"):
        teacher_solution(
            "chatty", Problem("L1-1+2", "1+2", "3", 1), random.Random(0), wrong_rate=0.0, overlong_rate=0.0
        )
