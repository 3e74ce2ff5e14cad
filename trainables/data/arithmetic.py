"""The built-in task: seeded integer arithmetic at four levels, and three programmatic teachers.

Prompts follow the papers' format (think inside <think></think>, answer in \\boxed{}). The teachers
write correct worked solutions in three styles and lengths, with a configurable rate of wrong or
over-long ones, so the offline store filters them as the papers' data is filtered.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

SYSTEM_PROMPT = "Think step by step inside <think> </think>, then give the final answer in \\boxed{}."
OVERLONG_FACTOR = 4  # an over-long solution is more than this many times its normal length


@dataclass(frozen=True)
class Problem:
    uid: str
    question: str
    answer: str
    level: int


# A level draws (question, answer); terms are kept as a list of (operator, value) for the teachers.
def _level1(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(0, 19), rng.randint(0, 19)
    return f"{a}+{b}", a + b


def _level2(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return (f"{a}+{b}", a + b) if rng.random() < 0.5 else (f"{a}-{b}", a - b)


def _level3(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(1, 9), rng.randint(1, 9), rng.randint(0, 20)
    return f"{a}*{b}+{c}", a * b + c


def _level4(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(1, 20), rng.randint(1, 9), rng.randint(1, 9)
    form = rng.randrange(3)
    if form == 0:
        return f"{a}+{b}*{c}", a + b * c
    if form == 1:
        return f"{b}*{c}-{a}", b * c - a
    return f"{a}-{b}+{c}", a - b + c


LEVELS: dict[int, Callable[[random.Random], tuple[str, int]]] = {1: _level1, 2: _level2, 3: _level3, 4: _level4}
LEVEL_SPACE = {1: 20 * 20, 2: 2 * 90 * 90, 3: 9 * 9 * 21, 4: 3 * 20 * 9 * 9}  # distinct questions


def make_splits(seed: int, levels: Sequence[int], train_size: int, val_size: int) -> tuple[list[Problem], list[Problem]]:
    """(train, validation), disjoint by question, deduplicated, deterministic from the seed."""
    capacity = sum(LEVEL_SPACE[lv] for lv in set(levels))
    if train_size + val_size > capacity * 0.9:
        raise ValueError(f"train_size + val_size ({train_size + val_size}) exceeds what levels {list(levels)} "
                         f"can hold without repeats (max {int(capacity * 0.9)}); lower task.train_size/val_size")
    rng = random.Random(seed)
    seen: set[str] = set()

    def draw(count: int) -> list[Problem]:
        out = []
        while len(out) < count:
            level = rng.choice(list(levels))
            question, answer = LEVELS[level](rng)
            if question not in seen:
                seen.add(question)
                out.append(Problem(f"L{level}-{question}", question, str(answer), level))
        return out

    val = draw(val_size)  # validation first: the train set then excludes every validation question
    return draw(train_size), val


def prompt_messages(problem: Problem) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": problem.question}]


# -- teachers ---------------------------------------------------------------------------------
def _split(question: str) -> tuple[list[int], list[str]]:
    """"7*3+4" -> ([7, 3, 4], ["*", "+"])."""
    nums, ops, cur = [], [], ""
    for ch in question:
        if ch in "+-*" and cur:
            nums.append(int(cur))
            ops.append(ch)
            cur = ""
        else:
            cur += ch
    nums.append(int(cur))
    return nums, ops


def _reduce_steps(question: str) -> list[tuple[str, int]]:
    """Evaluation steps with precedence: [("3*4", 12), ("5+12", 17)]."""
    nums, ops = _split(question)
    steps = []
    while "*" in ops:
        i = ops.index("*")
        value = nums[i] * nums[i + 1]
        steps.append((f"{nums[i]}*{nums[i + 1]}", value))
        nums[i : i + 2], ops[i : i + 1] = [value], []
    while ops:
        a, op, b = nums[0], ops[0], nums[1]
        value = a + b if op == "+" else a - b
        steps.append((f"{a}{op}{b}", value))
        nums[0:2], ops[0:1] = [value], []
    return steps


def _column_addition(a: int, b: int) -> str:
    """Digit-by-digit addition of non-negative a + b with carries."""
    parts, carry, da, db = [], 0, str(a)[::-1], str(b)[::-1]
    for i in range(max(len(da), len(db))):
        x, y = int(da[i]) if i < len(da) else 0, int(db[i]) if i < len(db) else 0
        total = x + y + carry
        expr = f"{x}+{y}" + (f"+{carry}" if carry else "")
        parts.append(f"{expr}={total} write {total % 10}" + (" carry 1" if total >= 10 else ""))
        carry = total // 10
    if carry:
        parts.append("write 1")
    return ". ".join(parts)


def _explain(expr: str, value: int) -> str:
    nums, ops = _split(expr)
    if ops == ["+"] and min(nums) >= 0:
        return f"{expr}: {_column_addition(*nums)}. so {value}"
    return f"{expr}={value}"


def terse(problem: Problem) -> str:
    steps = _reduce_steps(problem.question)
    chain = ". ".join(f"{e}={v}" for e, v in steps)
    return f"<think>{chain}</think>\\boxed{{{problem.answer}}}"


def stepwise(problem: Problem) -> str:
    lines = ". ".join(_explain(e, v) for e, v in _reduce_steps(problem.question))
    return f"<think>{lines}.</think>The answer is \\boxed{{{problem.answer}}}."


def verbose(problem: Problem) -> str:
    steps = _reduce_steps(problem.question)
    body = " ".join(f"First {e}. {e}={v}." if i == 0 else f"Then {e}={v}." for i, (e, v) in enumerate(steps))
    last_expr, value = steps[-1]
    nums, ops = _split(last_expr)
    check = f"{value}-{nums[1]}={value - nums[1]}" if ops == ["+"] else f"{value}={last_expr}"
    return (f"<think>We need {problem.question}. {body} Check: {check}. Correct.</think>"
            f"So the final answer is \\boxed{{{problem.answer}}}.")


TEACHERS: dict[str, Callable[[Problem], str]] = {"terse": terse, "stepwise": stepwise, "verbose": verbose}


def teacher_solution(name: str, problem: Problem, rng: random.Random, *, wrong_rate: float,
                     overlong_rate: float) -> tuple[str, str]:
    """(solution, kind) with kind "correct", "wrong" (off by a small amount) or "overlong"."""
    for arg, rate in (("wrong_rate", wrong_rate), ("overlong_rate", overlong_rate)):
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"{arg} must be in [0, 1), got {rate}")
    text = TEACHERS[name](problem)
    draw = rng.random()
    if draw < wrong_rate:
        wrong = str(int(problem.answer) + rng.choice([-2, -1, 1, 2]))
        think, _, rest = text.partition("</think>")
        cut = think.rfind(problem.answer)  # the reasoning's last statement of the result
        think = think[:cut] + wrong + think[cut + len(problem.answer):]
        rest = rest.replace(f"\\boxed{{{problem.answer}}}", f"\\boxed{{{wrong}}}")
        return f"{think}</think>{rest}", "wrong"
    if draw < wrong_rate + overlong_rate:
        think, _, rest = text.partition("</think>")
        filler = " Let me recompute that once more." + think.removeprefix("<think>")
        return think + filler * (OVERLONG_FACTOR + 1) + "</think>" + rest, "overlong"
    return text, "correct"


def teacher_dataset(problems: Sequence[Problem], rng_seed: int, *, teachers: Sequence[str] = tuple(TEACHERS),
                    wrong_rate: float = 0.05, overlong_rate: float = 0.05) -> list[dict[str, str]]:
    """One row per (problem, teacher): uid, question, answer, teacher, solution, kind."""
    rng = random.Random(rng_seed)
    rows = []
    for problem in problems:
        for name in teachers:
            text, kind = teacher_solution(name, problem, rng, wrong_rate=wrong_rate, overlong_rate=overlong_rate)
            rows.append({"uid": problem.uid, "question": problem.question, "answer": problem.answer,
                         "teacher": name, "solution": text, "kind": kind})
    return rows
