"""Benchmark metrics over sampled answers: pass@k, worst@k, avg@k and majority@N.

pass@k is the unbiased estimator of Chen et al. 2021 (the chance that at least one of k samples, drawn
without replacement from n with c correct, is correct); worst@k is its mirror, the chance that all k
are (EAD's Worst@16). avg@k is the mean accuracy of k rollouts per problem, the "pass@1 at 32 rollouts"
OGER reports on AIME and AMC; majority@N is EAD's Majority@N, a vote over N sampled answers grouped by
math-verify equality. All are pure functions of booleans, strings and numbers.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException

from trainables.metrics import metric_key, summary_keys  # noqa: F401 - evaluate and validation's names
from trainables.rewards.verify import answer_part, time_limit, verify_response

_BOXED = re.compile(r"\\boxed\s*\{")
_ANSWER_CONFIG = [LatexExtractionConfig(), ExprExtractionConfig()]
_CHOICE = re.compile(r"[A-Z]")  # a multiple-choice answer: one capital letter
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")  # 42, -3, 0.5, 1/2
ANSWER_FORMATS = ("think", "boxed", "last_number")
_PARSE_CACHE_SIZE = 65536  # a vote compares each answer with several groups: parse each string once

Equal = Callable[[str, str], bool]


# ---------------------------------------------------------------------------------------------------
# Sample-count estimators


def _check_counts(n: int, c: int, k: int) -> None:
    if not 0 <= c <= n:
        raise ValueError(f"c (correct samples) must be in [0, n={n}], got c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, n={n}] (draw at most the n samples there are), got k={k}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. 2021: pass@k = 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k/i).

    The product form never builds the huge binomials (n = 256, k = 128 overflows a float).
    """
    _check_counts(n, c, k)
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        all_wrong *= 1.0 - k / i
    return 1.0 - all_wrong


def worst_at_k(n: int, c: int, k: int) -> float:
    """E[min of k samples drawn without replacement] = C(c, k) / C(n, k) = prod_{i=0}^{k-1} (c-i)/(n-i)."""
    _check_counts(n, c, k)
    if c < k:  # every k-subset holds a wrong sample
        return 0.0
    all_right = 1.0
    for i in range(k):
        all_right *= (c - i) / (n - i)
    return all_right


def _check_problems(correct_per_problem: Sequence[Sequence[bool]]) -> None:
    if not correct_per_problem:
        raise ValueError("correct_per_problem is empty; pass one list of sample verdicts per problem")
    for index, correct in enumerate(correct_per_problem):
        if not correct:
            raise ValueError(f"correct_per_problem[{index}] has no samples; sample each problem at least once")


def avg_at_k(correct: Sequence[Sequence[bool]]) -> float:
    """avg@k = (1/P) sum_p (1/k_p) sum_j correct[p][j]: mean accuracy of each problem's k samples."""
    _check_problems(correct)
    return sum(sum(samples) / len(samples) for samples in correct) / len(correct)


def avg_at_k_se(correct: Sequence[Sequence[bool]]) -> float:
    """Standard error of avg@k over problems: sd_p((1/k_p) sum_j correct[p][j]) / sqrt(P), the sd with P - 1.
    Clustered by problem, it holds both the draw of the problems and the sampling noise within each."""
    _check_problems(correct)
    means = [sum(samples) / len(samples) for samples in correct]
    if len(means) < 2:
        return float("nan")
    mean = sum(means) / len(means)
    return math.sqrt(sum((m - mean) ** 2 for m in means) / (len(means) - 1) / len(means))


def mean_pass_at_k(correct_per_problem: Sequence[Sequence[bool]], k: int) -> float:
    """(1/P) sum_p pass@k(n_p, c_p, k), each problem with its own sample count n_p."""
    _check_problems(correct_per_problem)
    scores = [pass_at_k(len(samples), sum(samples), k) for samples in correct_per_problem]
    return sum(scores) / len(scores)


def mean_worst_at_k(correct_per_problem: Sequence[Sequence[bool]], k: int) -> float:
    """(1/P) sum_p worst@k(n_p, c_p, k), each problem with its own sample count n_p."""
    _check_problems(correct_per_problem)
    scores = [worst_at_k(len(samples), sum(samples), k) for samples in correct_per_problem]
    return sum(scores) / len(scores)


# ---------------------------------------------------------------------------------------------------
# Answers: extraction and equality


def _box_content(text: str, open_brace: int) -> str | None:
    """The text between the `{` at `open_brace` and its matching `}`; None if it never closes."""
    depth = 0
    for position in range(open_brace, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            depth -= 1
            if depth == 0:
                return text[open_brace + 1 : position]
    return None


def extract_answer(response: str, answer_format: str = "think") -> str | None:
    """The answer in `response`, read as `answer_format` says (ANSWER_FORMATS):

    think: the last \\boxed{...} after the last `</think>` (the trained format; nested braces kept);
    boxed: the last \\boxed{...} anywhere (how the papers read Qwen2.5-Math, which writes no think block);
    last_number: that box, else the last number in the text (for chat models that rarely box).
    None when there is none, or the box never closes or is empty.
    """
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format must be one of {', '.join(ANSWER_FORMATS)}, got {answer_format!r}")
    answer_text = answer_part(response) if answer_format == "think" else response
    if answer_text is None:
        return None
    boxes = list(_BOXED.finditer(answer_text))
    content = _box_content(answer_text, boxes[-1].end() - 1) if boxes else None  # end() - 1 is the box's `{`
    if content is not None and content.strip():
        return content.strip()
    if answer_format == "last_number" and (numbers := _NUMBER.findall(answer_text)):
        return numbers[-1]
    return None


@functools.lru_cache(maxsize=_PARSE_CACHE_SIZE)
def _parsed(answer: str, limit: int | None) -> tuple:
    """math-verify's parse of `$answer$`; the limit is in the key since it depends on the thread."""
    return tuple(parse(f"${answer}$", extraction_config=_ANSWER_CONFIG, parsing_timeout=limit, raise_on_error=True))


def answers_equal(a: str, b: str) -> bool:
    """a == b under math-verify ("1/2" == "0.5" == "\\frac{1}{2}"); `a` is the reference (gold) side.

    Single capital letters (multiple choice) compare as text, case-insensitively: math-verify would read
    "I" as the imaginary unit and "E" as Euler's number. Never raises; junk is unequal to anything else.
    """
    if a == b:
        return True
    a, b = a.strip(), b.strip()
    if _CHOICE.fullmatch(a) or _CHOICE.fullmatch(b):
        return a.casefold() == b.casefold()
    limit = time_limit()  # off the main thread signal.alarm is unavailable: no limit (see verify.py)
    try:
        gold, prediction = _parsed(a, limit), _parsed(b, limit)
        # verify(gold, prediction): math-verify is not symmetric.
        return bool(gold and prediction) and verify(
            list(gold), list(prediction), timeout_seconds=limit, raise_on_error=True
        )
    except (TimeoutException, TimeoutError):  # TimeoutException is a BaseException: name it
        return False
    except Exception:  # noqa: BLE001 - the boundary with untrusted model text: sympy can fail in any way
        return False


def judge(
    texts: Sequence[str], gold: str, multiple_choice: bool, answer_format: str = "think"
) -> tuple[list[bool], list[str | None]]:
    """Each sample's correctness and extracted answer. In the trained format a math answer is right
    when its verifiable reward is 1 (think block, box, math-verify); otherwise the extracted answer
    must equal the gold one under math-verify (multiple choice: the letter, as text)."""
    answers = [extract_answer(text, answer_format) for text in texts]
    if answer_format == "think" and not multiple_choice:
        return [verify_response(text, gold).reward == 1.0 for text in texts], answers
    return [a is not None and answers_equal(gold, a) for a in answers], answers


# ---------------------------------------------------------------------------------------------------
# Majority vote


def majority_answer(answers: Sequence[str | None], equal: Equal = answers_equal) -> str | None:
    """The representative of the largest group of `equal` answers; None answers never vote.

    Greedy clustering: each answer joins the first group whose representative (its first answer) it
    equals; ties go to the group seen first. None when no answer votes.
    """
    representatives: list[str] = []
    votes: list[int] = []
    for answer in answers:
        if answer is None:
            continue
        group = next((g for g, rep in enumerate(representatives) if equal(rep, answer)), None)
        if group is None:
            representatives.append(answer)
            votes.append(1)
        else:
            votes[group] += 1
    if not votes:
        return None
    return representatives[votes.index(max(votes))]  # index() finds the first maximum: the earliest group


def majority_at_n(
    answers_per_problem: Sequence[Sequence[str | None]],
    golds: Sequence[str],
    n: int | None = None,
    equal: Equal = answers_equal,
) -> float:
    """Majority@N = (1/P) sum_p [maj(answers_p[:N]) == gold_p]; N = all samples when None."""
    if len(answers_per_problem) != len(golds) or not golds:
        raise ValueError(
            f"answers_per_problem has {len(answers_per_problem)} problems but golds has "
            f"{len(golds)}; pass one gold answer per problem (and at least one problem)"
        )
    fewest = min(len(answers) for answers in answers_per_problem)
    if n is not None and not 1 <= n <= fewest:
        raise ValueError(f"n must be in [1, {fewest}] (the fewest samples of any problem), got n={n}")
    hits = 0
    for answers, gold in zip(answers_per_problem, golds):
        winner = majority_answer(answers[:n], equal)
        hits += winner is not None and equal(gold, winner)
    return hits / len(golds)


# ---------------------------------------------------------------------------------------------------
# Tables


def macro_average(per_benchmark: dict[str, float]) -> float:
    """The unweighted mean over benchmarks: (1/B) sum_b score_b."""
    if not per_benchmark:
        raise ValueError("per_benchmark is empty; pass at least one benchmark's score")
    return sum(per_benchmark.values()) / len(per_benchmark)


def macro_row(rows: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Key by key, the unweighted mean of the benchmarks' rows, over the keys every row has (benchmarks
    sampled k times each share all of them), in the first row's order."""
    keys = [key for key in next(iter(rows.values())) if all(key in row for row in rows.values())]
    return {key: macro_average({name: row[key] for name, row in rows.items()}) for key in keys}


def summarize(
    correct_per_problem: Sequence[Sequence[bool]],
    answers_per_problem: Sequence[Sequence[str | None]],
    golds: Sequence[str],
) -> dict[str, float]:
    """One benchmark's table row: avg@k, pass@j and maj@j for j = 1, 2, 4, ... (powers of two <= k, and k),
    worst@k.

    k is the fewest samples of any problem. avg@k and maj@j read each problem's first k (j) samples: maj@j
    against j is EAD's inference-time scaling curve. pass@j and worst@k are unbiased estimators and use
    all n_p samples of each problem.
    """
    _check_problems(correct_per_problem)
    if [len(c) for c in correct_per_problem] != [len(a) for a in answers_per_problem]:
        raise ValueError(
            "correct_per_problem and answers_per_problem differ in shape; pass one verdict "
            "per sampled answer, problem by problem"
        )
    k = min(len(samples) for samples in correct_per_problem)
    row = {f"avg@{k}": avg_at_k([samples[:k] for samples in correct_per_problem])}
    for key in summary_keys(k)[1:-1]:
        name, n = key.split("@")
        row[key] = (
            mean_pass_at_k(correct_per_problem, int(n))
            if name == "pass"
            else majority_at_n(answers_per_problem, golds, int(n))
        )
    row[f"worst@{k}"] = mean_worst_at_k(correct_per_problem, k)
    return row
