"""The built-in task: seeded integer arithmetic at four levels, and three programmatic teachers.

Prompts follow the papers' format (think inside <think></think>, answer in \\boxed{}). The teachers
write correct worked solutions in three styles and lengths (terse < stepwise < verbose), with a
configurable rate of wrong or over-long ones, so the offline store has something to filter, as the
papers' teacher data is filtered. The vocabulary is small and regular: a tiny BPE tokenizer is
trained on this text.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

SYSTEM_PROMPT = "Think step by step inside <think> </think>, then give the final answer in \\boxed{}."
OVERLONG_FACTOR = 4  # an over-long solution is more than this many times its normal length
WRONG_OFFSETS = (-2, -1, 1, 2)  # a wrong solution's final answer is off by one of these
MAX_DRAWS_PER_QUESTION = 1_000_000  # guards the rejection sampler against a wrong LEVEL_SPACE


@dataclass(frozen=True)
class Problem:
    uid: str  # f"L{level}-{question}"
    question: str  # "17+25", "7*3+4": no spaces, operators + - *
    answer: str  # the exact integer, "42" or "-3"
    level: int
    messages: tuple[tuple[str, str], ...] = ()  # a data file's chat-list prompt, (role, content) turns


# -- levels: each draws (question, exact integer answer) from its own, disjoint question space --
def _level1(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(0, 19), rng.randint(0, 19)
    return f"{a}+{b}", a + b


def _level2(rng: random.Random) -> tuple[str, int]:
    while True:
        a, b, minus = rng.randint(10, 99), rng.randint(10, 99), rng.random() < 0.5
        if minus:
            return f"{a}-{b}", a - b
        if max(a, b) >= 20:  # both under 20 is a level-1 question: keep the levels' spaces disjoint
            return f"{a}+{b}", a + b


def _level3(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(1, 9), rng.randint(1, 9), rng.randint(0, 20)
    return f"{a}*{b}+{c}", a * b + c


# Three operands, precedence matters in three of the four forms; (a, b, c) = (1..20, 1..9, 1..9).
_LEVEL4_FORMS: tuple[Callable[[int, int, int], tuple[str, int]], ...] = (
    lambda a, b, c: (f"{a}+{b}*{c}", a + b * c),
    lambda a, b, c: (f"{a}-{b}*{c}", a - b * c),
    lambda a, b, c: (f"{b}*{c}-{a}", b * c - a),
    lambda a, b, c: (f"{a}-{b}+{c}", a - b + c),
)


def _level4(rng: random.Random) -> tuple[str, int]:
    form = rng.choice(_LEVEL4_FORMS)
    return form(rng.randint(1, 20), rng.randint(1, 9), rng.randint(1, 9))


LEVELS: dict[int, Callable[[random.Random], tuple[str, int]]] = {1: _level1, 2: _level2, 3: _level3, 4: _level4}
# Distinct questions per level (exact: the sampler relies on it to know when a level is used up).
LEVEL_SPACE: dict[int, int] = {
    1: 20 * 20,
    2: 90 * 90 + (90 * 90 - 10 * 10),  # every a-b; a+b without the 10..19 + 10..19 of level 1
    3: 9 * 9 * 21,
    4: len(_LEVEL4_FORMS) * 20 * 9 * 9,
}
assert LEVEL_SPACE.keys() == LEVELS.keys()


def _draw_question(rng: random.Random, level: int, seen: set[str]) -> Problem:
    """A question of `level` not in `seen` (rejection sampling: spaces are a few thousand)."""
    for _ in range(MAX_DRAWS_PER_QUESTION):
        question, answer = LEVELS[level](rng)
        if question not in seen:
            seen.add(question)
            return Problem(f"L{level}-{question}", question, str(answer), level)
    raise RuntimeError(f"level {level} yielded no new question; LEVEL_SPACE[{level}] overstates its space")


def _draw(rng: random.Random, levels: Sequence[int], count: int, seen: set[str], used: Counter) -> list[Problem]:
    """`count` new problems, each level drawn uniformly from the levels not yet used up."""
    out = []
    for _ in range(count):
        open_levels = [lv for lv in levels if used[lv] < LEVEL_SPACE[lv]]
        level = rng.choice(open_levels)
        used[level] += 1
        out.append(_draw_question(rng, level, seen))
    return out


def make_splits(
    seed: int, levels: Sequence[int], train_size: int, val_size: int
) -> tuple[list[Problem], list[Problem]]:
    """(train, validation): disjoint by question, deduplicated, deterministic from the seed.

    Each problem's level is drawn uniformly from `levels`; a level whose questions are all taken
    drops out of the draw, so a request up to the levels' total space always succeeds.
    """
    unknown = sorted(set(levels) - set(LEVELS))
    if not levels or unknown:
        raise ValueError(f"levels must be a non-empty list from {sorted(LEVELS)}, got {list(levels)}")
    if train_size < 0 or val_size < 0:
        raise ValueError(f"train_size ({train_size}) and val_size ({val_size}) must be >= 0")
    capacity = sum(LEVEL_SPACE[lv] for lv in set(levels))
    if train_size + val_size > capacity:
        raise ValueError(
            f"train_size + val_size = {train_size} + {val_size} exceeds the {capacity} distinct "
            f"questions of levels {sorted(set(levels))} (the max); lower task.train_size/val_size "
            "or add levels"
        )
    rng, seen, used = random.Random(seed), set(), Counter()
    val = _draw(rng, levels, val_size, seen, used)  # validation first; train then excludes all of it
    return _draw(rng, levels, train_size, seen, used), val


# -- worked steps -----------------------------------------------------------------------------------
class Step(NamedTuple):
    a: int
    op: str  # "+", "-" or "*"
    b: int
    value: int

    @property
    def expr(self) -> str:
        return f"{self.a}{self.op}{self.b}"


def _tokens(question: str) -> tuple[list[int], list[str]]:
    """ "7*3+4" -> ([7, 3, 4], ["*", "+"]) (questions hold no negative literals)."""
    nums, ops, digits = [], [], ""
    for ch in question:
        if ch in "+-*":
            nums.append(int(digits))
            ops.append(ch)
            digits = ""
        else:
            digits += ch
    return nums + [int(digits)], ops


def reduce_steps(question: str) -> list[Step]:
    """Evaluation order with precedence: "5+3*4" -> [Step(3, "*", 4, 12), Step(5, "+", 12, 17)]."""
    nums, ops = _tokens(question)
    steps = []
    while ops:
        # Multiplication first (leftmost), then + and - left to right.
        i = ops.index("*") if "*" in ops else 0
        a, op, b = nums[i], ops[i], nums[i + 1]
        value = a * b if op == "*" else a + b if op == "+" else a - b
        steps.append(Step(a, op, b, value))
        nums[i : i + 2], ops[i : i + 1] = [value], []
    return steps


def _with_final(steps: list[Step], value: int) -> list[Step]:
    """The same steps, with the last one stating `value` (how a wrong teacher errs)."""
    return steps[:-1] + [steps[-1]._replace(value=value)]


# -- the three styles: each renders (question, steps) and states steps[-1].value as the answer -------
def _digits(n: int) -> list[int]:
    return [int(d) for d in str(n)[::-1]]  # ones first


def _column_add(a: int, b: int) -> list[str]:
    """Digit-by-digit a+b (a, b >= 0): "7+5=12 write 2 carry 1", ..., the last column written whole."""
    da, db, carry, lines = _digits(a), _digits(b), 0, []
    width = max(len(da), len(db))
    for i in range(width):
        x, y = da[i] if i < len(da) else 0, db[i] if i < len(db) else 0
        total = x + y + carry
        line = f"{x}+{y}" + ("+1" if carry else "") + f"={total}"
        if i < width - 1:
            line += f" write {total % 10}" + (" carry 1" if total >= 10 else "")
        lines.append(line)
        carry = total // 10
    return lines


def _column_sub(a: int, b: int) -> list[str]:
    """Digit-by-digit a-b (a >= b >= 0): "12-7=5 borrow 1", then "5-1-1=3", ..."""
    da, db, borrow, lines = _digits(a), _digits(b), 0, []
    for i, x in enumerate(da):
        y = db[i] if i < len(db) else 0
        top = f"{x}" + ("-1" if borrow else "")
        x -= borrow
        borrow = int(x < y)
        lines.append(f"1{top}-{y}={x + 10 - y} borrow 1" if borrow else f"{top}-{y}={x - y}")
    return lines


def _column(step: Step) -> str:
    """One step, column style for + and - of non-negatives; products (one digit each) stated."""
    a, op, b, value = step
    if op == "+" and a >= 0:
        return f"{step.expr}: " + ". ".join(_column_add(a, b)) + f". so {value}"
    if op == "-" and a >= b >= 0:
        return f"{step.expr}: " + ". ".join(_column_sub(a, b)) + f". so {value}"
    if op == "-" and b > a >= 0:  # a-b = -(b-a): subtract the smaller from the larger
        return f"{step.expr}=-({b}-{a}). {b}-{a}: " + ". ".join(_column_sub(b, a)) + f". so {value}"
    return f"{step.expr}={value}"


def _decompose(step: Step) -> list[str]:
    """17+25 -> ["17+20=37", "37+5=42"]: tens of the second operand first, then its ones."""
    a, op, b, value = step
    tens, ones = b - b % 10, b % 10
    if op == "*" or tens == 0 or ones == 0:
        return [f"{step.expr}={value}"]
    middle = a + tens if op == "+" else a - tens
    return [f"{a}{op}{tens}={middle}", f"{middle}{op}{ones}={value}"]


def _check(step: Step) -> str:
    """Undo the last step from its stated value: 42-25=17 for 17+25=42."""
    a, op, b, value = step
    if op == "+":
        return f"{value}-{b}={value - b}"
    if op == "-":
        return f"{value}+{b}={value + b}"
    return f"{value}/{b}={value // b}"


def _render_terse(question: str, steps: list[Step]) -> str:
    chain = ". ".join(f"{s.expr}={s.value}" for s in steps)
    return f"<think>{chain}</think>\\boxed{{{steps[-1].value}}}"


def _render_stepwise(question: str, steps: list[Step]) -> str:
    lines = ". ".join(_column(s) for s in steps)
    return f"<think>{lines}.</think>The answer is \\boxed{{{steps[-1].value}}}."


def _render_verbose(question: str, steps: list[Step]) -> str:
    parts = [f"We need {question}."]
    for i, step in enumerate(steps):
        said = _decompose(step)
        if len(steps) > 1:  # name the order of work when precedence decides it
            lead = "First" if i == 0 else "Then"
            said = [f"{lead} {said[0]}"] + said[1:] if len(said) == 1 else [f"{lead} {step.expr}"] + said
        parts += [f"{s}." for s in said]
    parts.append(f"Check: {_check(steps[-1])}. Correct.")
    return f"<think>{' '.join(parts)}</think>So the final answer is \\boxed{{{steps[-1].value}}}."


_RENDERERS: dict[str, Callable[[str, list[Step]], str]] = {
    "terse": _render_terse,
    "stepwise": _render_stepwise,
    "verbose": _render_verbose,
}


def _teacher(render: Callable[[str, list[Step]], str]) -> Callable[[Problem], str]:
    def teacher(problem: Problem) -> str:
        return render(problem.question, reduce_steps(problem.question))

    teacher.__doc__ = f"A correct worked solution, {render.__name__.removeprefix('_render_')} style."
    return teacher


TEACHERS: dict[str, Callable[[Problem], str]] = {name: _teacher(render) for name, render in _RENDERERS.items()}


# -- imperfect teachers ----------------------------------------------------------------------------
def _pad(text: str) -> str:
    """Repeat the reasoning inside <think> until the text is > OVERLONG_FACTOR x as long."""
    think, close, rest = text.partition("</think>")
    body = think.removeprefix("<think>")
    padded = think
    while len(padded) + len(close) + len(rest) <= OVERLONG_FACTOR * len(text):
        padded += f" Again. {body}"
    return padded + close + rest


def teacher_solution(
    name: str, problem: Problem, rng: random.Random, *, wrong_rate: float, overlong_rate: float
) -> tuple[str, str]:
    """(solution, kind): "wrong" with prob. wrong_rate, "overlong" with prob. overlong_rate, else "correct".

    A wrong solution states an answer off by a small nonzero amount in its reasoning's last step and
    in the box; an over-long one is correct, padded with repeated reasoning to > 4x its length.
    """
    for arg, rate in (("wrong_rate", wrong_rate), ("overlong_rate", overlong_rate)):
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"{arg} must be in [0, 1), got {rate}")
    if wrong_rate + overlong_rate > 1.0:
        raise ValueError(f"wrong_rate + overlong_rate must be <= 1, got {wrong_rate} + {overlong_rate}")
    if name not in _RENDERERS:
        raise ValueError(f"unknown teacher {name!r}; choose from {sorted(_RENDERERS)}")
    render, steps = _RENDERERS[name], reduce_steps(problem.question)
    draw = rng.random()
    if draw < wrong_rate:
        wrong = int(problem.answer) + rng.choice(WRONG_OFFSETS)
        return render(problem.question, _with_final(steps, wrong)), "wrong"
    text = render(problem.question, steps)
    if draw < wrong_rate + overlong_rate:
        return _pad(text), "overlong"
    return text, "correct"


def teacher_dataset(
    problems: Sequence[Problem],
    rng_seed: int,
    *,
    teachers: Sequence[str] = tuple(TEACHERS),
    wrong_rate: float = 0.05,
    overlong_rate: float = 0.05,
) -> list[dict[str, str]]:
    """One row per (problem, teacher): uid, question, answer, teacher, solution, kind."""
    rng = random.Random(rng_seed)
    rows = []
    for problem in problems:
        for name in teachers:
            text, kind = teacher_solution(name, problem, rng, wrong_rate=wrong_rate, overlong_rate=overlong_rate)
            rows.append(
                {
                    "uid": problem.uid,
                    "question": problem.question,
                    "answer": problem.answer,
                    "teacher": name,
                    "solution": text,
                    "kind": kind,
                }
            )
    return rows
