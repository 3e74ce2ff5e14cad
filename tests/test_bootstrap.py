"""The embedded default policy's warm start: what it imitates, and the base it leaves."""

import random

from trainables.data.arithmetic import TEACHERS, make_splits, teacher_solution
from trainables.data.bootstrap import unbox
from trainables.rewards.verify import verify_response


def test_unboxed_solutions_keep_the_answer_but_fail_the_format():
    problems, _ = make_splits(3, [1, 2, 3, 4], train_size=12, val_size=0)
    rng = random.Random(0)
    for problem in problems:
        for teacher in TEACHERS:
            solution, _ = teacher_solution(teacher, problem, rng, wrong_rate=0.0, overlong_rate=0.0)
            plain = unbox(solution)
            assert verify_response(solution, problem.answer).reason == "correct"
            assert verify_response(plain, problem.answer).reason == "no_boxed"
            assert "\\boxed" not in plain and plain.rstrip(".").endswith(problem.answer)
