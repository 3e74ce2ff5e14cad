"""The papers' evaluation benchmarks, read from local files; nothing is ever downloaded.

Export each benchmark from its public Hugging Face dataset as Parquet, JSONL (or .json lines / a
.json array) or CSV, put the file anywhere, and pass its path with the benchmark's name. The columns
are the ones the dataset publishes:

  name           source (subset / split)                     question  gold answer                           uid
  aime24         HuggingFaceH4/aime_2024 (train)             problem   answer                                id
  aime25         opencompass/AIME2025 (I + II in one file)   question  answer                                row
  amc            AI-MO/aimo-validation-amc (train)           problem   answer (142.0 -> "142")               id
  math500        HuggingFaceH4/MATH-500 (test)               problem   answer                                unique_id
  minerva        math-ai/minervamath (test)                  question  answer                                row
  olympiadbench  Hothan/OlympiadBench (OE_TO_maths_en_COMP)  question  final_answer[0] (a list of strings)   id
  arc_challenge  allenai/ai2_arc (ARC-Challenge, test)       question  choices {text, label}, answerKey      id
  gpqa_diamond   Idavidrein/gpqa (gpqa_diamond)              Question  Correct Answer, Incorrect Answer 1-3  Record ID
  mmlu_pro       TIGER-Lab/MMLU-Pro (test)                   question  options (up to 10), answer (A-J)      question_id

The first six are math (the gold answer is checked with math-verify); the last three are multiple
choice: the question lists the options as "A. ..." lines and the gold answer is a letter. ARC's
answerKey is a label ("C", or "3" in some rows) and becomes the letter of its position; GPQA's four
answers are shuffled per question by an RNG seeded from (seed, uid). A uid is "<name>-<id>" where the
dataset has an id column, else "<name>-<row index>". The built-in task's validation split is the
benchmark "arithmetic" (`as_benchmark` of its problems; `trainables.tasks.builtin_validation`).

Bad rows never raise: each is skipped and counted under a reason ("missing:question", "type:answer",
"invalid:choices", ...; `trainables.data.records`). Only an unusable file raises `BenchmarkError`, one line.
"""

from __future__ import annotations

import math
import random
import string
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from trainables.data.arithmetic import Problem
from trainables.data.records import READERS, BadRecord, answer, check_row, file_problem, read_records, suffix_of, text

BUILTIN = "arithmetic"  # the built-in task's validation split; it has no file
LETTERS = string.ascii_uppercase  # option letters; MMLU-Pro uses up to J
MIN_CHOICES = 2


class BenchmarkError(ValueError):
    """A benchmark file that cannot be used; the message is one line naming the benchmark, file and fix."""


@dataclass(frozen=True)
class BenchmarkProblem:
    uid: str  # "<name>-<dataset id>" or "<name>-<row index>"
    question: str  # as the model sees it; multiple choice lists "A. ..." lines after the question
    answer: str  # math: the gold answer for math-verify; multiple choice: the gold letter
    choices: tuple[str, ...] = ()  # option texts in letter order; empty for math


# -- cell values -----------------------------------------------------------------------------------
def _answer_text(value: Any) -> str:
    """A math gold answer as text; whole numbers without ".0" (AMC's file stores 142 as 142.0)."""
    if isinstance(value, float):
        if not math.isfinite(value):  # NaN is how pandas exports write a null
            raise BadRecord("missing:answer")
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return answer(value, "answer")


def _options(value: Any) -> tuple[str, ...]:
    """A list of MIN_CHOICES..26 non-empty option texts, stripped, or BadRecord("invalid:choices")."""
    if not isinstance(value, (list, tuple)) or not MIN_CHOICES <= len(value) <= len(LETTERS):
        raise BadRecord("invalid:choices")
    if not all(isinstance(option, str) and option.strip() for option in value):
        raise BadRecord("invalid:choices")
    return tuple(option.strip() for option in value)


def _letter(value: Any, num_options: int) -> str:
    """A gold letter among the first `num_options`, or BadRecord."""
    letter = text(value, "answer").strip().upper()
    if len(letter) != 1 or letter not in LETTERS[:num_options]:
        raise BadRecord("invalid:answer")
    return letter


# -- gold answers: (values of a layout's gold columns, the question's RNG) -> (answer, choices) ----
Gold = Callable[[Sequence[Any], random.Random], tuple[str, tuple[str, ...]]]


def _math_gold(values: Sequence[Any], rng: random.Random) -> tuple[str, tuple[str, ...]]:
    (answer,) = values
    return _answer_text(answer), ()


def _first_of_list_gold(values: Sequence[Any], rng: random.Random) -> tuple[str, tuple[str, ...]]:
    """OlympiadBench: `final_answer` is a list of strings; the first is the gold answer."""
    (answers,) = values
    if answers is None:
        raise BadRecord("missing:answer")
    if not isinstance(answers, (list, tuple)):
        raise BadRecord("type:answer")
    if not answers:
        raise BadRecord("empty:answer")
    return _answer_text(answers[0]), ()


def _arc_gold(values: Sequence[Any], rng: random.Random) -> tuple[str, tuple[str, ...]]:
    """ARC: the answerKey is one of the choices' labels ("A".."E" or "1".."5"): its position is the letter."""
    choices, key = values
    if not isinstance(choices, Mapping):
        raise BadRecord("invalid:choices")
    options, labels = _options(choices.get("text")), choices.get("label")
    if not isinstance(labels, (list, tuple)) or len(labels) != len(options):
        raise BadRecord("invalid:choices")
    labels = [label.strip() if isinstance(label, str) else label for label in labels]
    key = text(key, "answer").strip()
    if key not in labels:
        raise BadRecord("invalid:answer")
    return LETTERS[labels.index(key)], options


def _gpqa_gold(values: Sequence[Any], rng: random.Random) -> tuple[str, tuple[str, ...]]:
    """GPQA: the correct answer then three wrong ones, shuffled; the gold letter follows the correct one."""
    correct = text(values[0], "answer").strip()
    answers = (correct, *_options(values[1:]))
    order = list(range(len(answers)))
    rng.shuffle(order)  # shuffle positions, not texts: a wrong answer equal to the right one stays wrong
    return LETTERS[order.index(0)], tuple(answers[i] for i in order)


def _mmlu_pro_gold(values: Sequence[Any], rng: random.Random) -> tuple[str, tuple[str, ...]]:
    options_value, letter = values
    options = _options(options_value)
    return _letter(letter, len(options)), options


@dataclass(frozen=True)
class Layout:
    """Where a public dataset keeps a benchmark's fields, and how its gold answer is read."""

    source: str  # the public dataset, with its subset / split
    kind: Literal["math", "choice"]  # math: checked with math-verify; choice: the answer is a letter
    question: str  # column of the question text
    gold_columns: tuple[str, ...]  # columns `gold` reads, in this order
    gold: Gold
    id_column: str | None = None  # the dataset's own id; None: the row index

    @property
    def columns(self) -> tuple[str, ...]:
        """The required columns."""
        return (self.question, *self.gold_columns)

    def describe(self) -> str:
        return f"a file of {self.source} with columns {list(self.columns)}"


BENCHMARKS: dict[str, Layout] = {
    "aime24": Layout("HuggingFaceH4/aime_2024 (train split)", "math", "problem", ("answer",), _math_gold, "id"),
    "aime25": Layout(
        "opencompass/AIME2025 (aime2025-I and aime2025-II joined in one file)",
        "math",
        "question",
        ("answer",),
        _math_gold,
    ),
    "amc": Layout("AI-MO/aimo-validation-amc (train split)", "math", "problem", ("answer",), _math_gold, "id"),
    "math500": Layout("HuggingFaceH4/MATH-500 (test split)", "math", "problem", ("answer",), _math_gold, "unique_id"),
    "minerva": Layout("math-ai/minervamath (test split)", "math", "question", ("answer",), _math_gold),
    "olympiadbench": Layout(
        "Hothan/OlympiadBench (OE_TO_maths_en_COMP: English, text-only, open-ended math)",
        "math",
        "question",
        ("final_answer",),
        _first_of_list_gold,
        "id",
    ),
    "arc_challenge": Layout(
        "allenai/ai2_arc (ARC-Challenge subset, test split)",
        "choice",
        "question",
        ("choices", "answerKey"),
        _arc_gold,
        "id",
    ),
    "gpqa_diamond": Layout(
        "Idavidrein/gpqa (gpqa_diamond subset)",
        "choice",
        "Question",
        ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3"),
        _gpqa_gold,
        "Record ID",
    ),
    "mmlu_pro": Layout(
        "TIGER-Lab/MMLU-Pro (test split)", "choice", "question", ("options", "answer"), _mmlu_pro_gold, "question_id"
    ),
}
BENCHMARK_NAMES: tuple[str, ...] = (*BENCHMARKS, BUILTIN)  # every name a caller can ask for


def check_name(name: str) -> None:
    """BenchmarkError unless `name` is a benchmark: a layout of BENCHMARKS, or the built-in arithmetic."""
    if name not in BENCHMARK_NAMES:
        raise BenchmarkError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARK_NAMES)}")


def _layout(name: str) -> Layout:
    if name == BUILTIN:
        raise BenchmarkError(
            f"benchmark {BUILTIN!r} is built in and has no file; use builtin_validation(task_cfg, seed)"
        )
    check_name(name)
    return BENCHMARKS[name]


def _read(name: str, layout: Layout, path: Path) -> list[Any]:
    """The file's records, after checking its suffix, existence and required columns."""
    where = f"{name} benchmark file {str(path)!r}"
    if suffix_of(path) is None:
        raise BenchmarkError(f"{where} has unsupported extension {path.suffix!r}; use one of {sorted(READERS)}")
    if not path.is_file():
        raise BenchmarkError(f"{where} not found; expected {layout.describe()}")
    try:
        records = list(read_records(path))
    except (OSError, ValueError, RecursionError) as error:  # pyarrow's ArrowInvalid, JSON and UTF-8 errors: ValueErrors
        raise BenchmarkError(f"{where} is {file_problem(path, error)}; expected {layout.describe()}") from None
    if not records:
        raise BenchmarkError(f"{where} has no rows; expected {layout.describe()}")
    found = list(dict.fromkeys(key for record in records if isinstance(record, Mapping) for key in record))
    missing = [column for column in layout.columns if column not in found]
    if missing:
        raise BenchmarkError(
            f"{where} has no column {', '.join(map(repr, missing))} (columns found: {found}); "
            f"expected {layout.describe()}"
        )
    return records


# -- rows -> problems ------------------------------------------------------------------------------
def _uid(name: str, layout: Layout, record: Mapping[str, Any], index: int) -> str:
    """The uid: "<name>-<id>" where the dataset's id column has a usable value, else "<name>-<row index>"."""
    own = record.get(layout.id_column) if layout.id_column else None
    if isinstance(own, float) and own.is_integer():
        own = int(own)
    if isinstance(own, (int, str)) and not isinstance(own, bool) and str(own).strip():
        return f"{name}-{str(own).strip()}"
    return f"{name}-{index}"


def _with_options(question: str, options: Sequence[str]) -> str:
    return question + "\n" + "\n".join(f"{letter}. {option}" for letter, option in zip(LETTERS, options))


def _problem(name: str, layout: Layout, record: Any, index: int, seed: int) -> BenchmarkProblem:
    """One file record as a problem, or BadRecord."""
    record = check_row(record)
    question = text(record.get(layout.question), "question").strip()
    uid = _uid(name, layout, record, index)
    rng = random.Random(f"{seed}:{uid}")  # per question: its shuffle does not depend on the row order or limit
    answer, choices = layout.gold([record.get(column) for column in layout.gold_columns], rng)
    return BenchmarkProblem(uid, _with_options(question, choices) if choices else question, answer, choices)


def load_benchmark(
    name: str, path: str | Path, *, limit: int | None = None, seed: int = 0
) -> tuple[list[BenchmarkProblem], Counter]:
    """(problems, skip counts by reason) of benchmark `name` read from `path` in its public layout.

    limit: keep the first `limit` good problems, in file order. seed: GPQA's option shuffle.
    Raises BenchmarkError (one line) for an unknown name or an unusable file, or when every row is bad.
    """
    layout, path = _layout(name), Path(path)
    if limit is not None and limit < 1:
        raise BenchmarkError(f"{name}: limit must be >= 1 or None, got {limit}")
    records = _read(name, layout, path)
    problems, skipped, seen = [], Counter(), set()
    for index, record in enumerate(records):
        if limit is not None and len(problems) == limit:
            break
        try:
            problem = _problem(name, layout, record, index, seed)
        except BadRecord as bad:
            skipped[bad.reason] += 1
            continue
        if problem.uid in seen:  # results are keyed by uid: a repeated id would be ambiguous
            skipped["duplicate:id"] += 1
            continue
        seen.add(problem.uid)
        problems.append(problem)
    if not problems:
        counts = ", ".join(f"{reason}={count}" for reason, count in sorted(skipped.items()))
        raise BenchmarkError(
            f"{name} benchmark file {str(path)!r}: all {len(records)} rows were skipped ({counts}); "
            f"expected {layout.describe()}"
        )
    return problems, skipped


def as_benchmark(problems: Sequence[Problem]) -> list[BenchmarkProblem]:
    """Problems of the built-in task (its validation split) as the benchmark arithmetic's."""
    return [BenchmarkProblem(f"{BUILTIN}-{problem.uid}", problem.question, problem.answer) for problem in problems]


def read_benchmarks(
    files: Mapping[str, str | None], builtin: Sequence[BenchmarkProblem], *, seed: int, limit: int | None = None
) -> tuple[dict[str, list[BenchmarkProblem]], dict[str, Counter]]:
    """{name: its first `limit` problems} for {name: file} (`arithmetic`: `builtin`, no file), and the
    rows skipped in each file (its reasons counted). seed: GPQA's option shuffle."""
    sets, skipped = {}, {}
    for name, path in files.items():
        if name == BUILTIN:
            sets[name], skipped[name] = list(builtin[:limit]), Counter()
        else:
            sets[name], skipped[name] = load_benchmark(name, path, limit=limit, seed=seed)
    return sets, skipped
