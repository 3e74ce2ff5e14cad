"""Benchmark files in their public layouts: each layout's mapping, the gold letters, and broken files."""

import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainables.config import TaskConfig
from trainables.data.benchmarks import (
    BENCHMARK_NAMES,
    BENCHMARKS,
    BUILTIN,
    BenchmarkError,
    BenchmarkProblem,
    load_benchmark,
)
from trainables.tasks import builtin_validation, load_task


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write(tmp_path, stem, suffix, rows):
    path = tmp_path / f"{stem}{suffix}"
    return write_parquet(path, rows) if suffix == ".parquet" else write_jsonl(path, rows)


def error_of(name, path, **kwargs) -> str:
    """The BenchmarkError message of load_benchmark, checked to be one line."""
    with pytest.raises(BenchmarkError) as caught:
        load_benchmark(name, path, **kwargs)
    message = str(caught.value)
    assert "\n" not in message and message.strip() == message
    return message


def test_registry_has_every_paper_benchmark():
    assert set(BENCHMARKS) == {
        "aime24",
        "aime25",
        "amc",
        "math500",
        "minerva",
        "olympiadbench",
        "arc_challenge",
        "gpqa_diamond",
        "mmlu_pro",
    }
    assert BENCHMARK_NAMES == (*BENCHMARKS, BUILTIN) and BUILTIN == "arithmetic"
    assert {name for name, layout in BENCHMARKS.items() if layout.kind == "choice"} == {
        "arc_challenge",
        "gpqa_diamond",
        "mmlu_pro",
    }


# -- math layouts ----------------------------------------------------------------------------------
def test_aime24(tmp_path):
    path = write_parquet(
        tmp_path / "aime24.parquet",
        [
            {"id": 60, "problem": "Find x.", "solution": "...", "answer": "204", "url": "u", "year": "2024"},
            {"id": 61, "problem": " Find y. ", "solution": "...", "answer": "25", "url": "u", "year": "2024"},
        ],
    )
    problems, skipped = load_benchmark("aime24", path)
    assert problems == [BenchmarkProblem("aime24-60", "Find x.", "204"), BenchmarkProblem("aime24-61", "Find y.", "25")]
    assert skipped == Counter()


def test_aime25_uses_row_index(tmp_path):
    path = write_jsonl(
        tmp_path / "aime25.jsonl", [{"question": "Q1", "answer": "70"}, {"question": "Q2", "answer": "588"}]
    )
    problems, _ = load_benchmark("aime25", path)
    assert [(p.uid, p.question, p.answer, p.choices) for p in problems] == [
        ("aime25-0", "Q1", "70", ()),
        ("aime25-1", "Q2", "588", ()),
    ]


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_amc_float_answers(tmp_path, suffix):
    path = write(
        tmp_path,
        "amc",
        suffix,
        [
            {"id": 0, "problem": "P0", "answer": 142.0, "url": "u"},
            {"id": 1, "problem": "P1", "answer": 0.5, "url": "u"},
            {"id": 2, "problem": "P2", "answer": -3.0, "url": "u"},
        ],
    )
    problems, skipped = load_benchmark("amc", path)
    assert [(p.uid, p.answer) for p in problems] == [("amc-0", "142"), ("amc-1", "0.5"), ("amc-2", "-3")]
    assert skipped == Counter()


def test_math500_uses_unique_id(tmp_path):
    path = write_jsonl(
        tmp_path / "math500.jsonl",
        [
            {
                "problem": "Convert $(0,3)$ to polar.",
                "solution": "...",
                "answer": "\\left( 3, \\frac{\\pi}{2} \\right)",
                "subject": "Precalculus",
                "level": 2,
                "unique_id": "test/precalculus/807.json",
            },
        ],
    )
    (problem,), _ = load_benchmark("math500", path)
    assert problem == BenchmarkProblem(
        "math500-test/precalculus/807.json", "Convert $(0,3)$ to polar.", "\\left( 3, \\frac{\\pi}{2} \\right)"
    )


def test_minerva(tmp_path):
    path = write_parquet(
        tmp_path / "minerva.parquet", [{"question": "Q", "answer": "1.2e3"}, {"question": "R", "answer": "7"}]
    )
    problems, _ = load_benchmark("minerva", path)
    assert [(p.uid, p.question, p.answer) for p in problems] == [("minerva-0", "Q", "1.2e3"), ("minerva-1", "R", "7")]


def test_olympiadbench_takes_first_final_answer(tmp_path):
    path = write_parquet(
        tmp_path / "olympiad.parquet",
        [
            {"id": 1606, "question": "Q1", "final_answer": ["$\\frac{1}{2}$"], "solution": ["..."]},
            {"id": 1607, "question": "Q2", "final_answer": ["3", "4"], "solution": ["..."]},
            {"id": 1608, "question": "Q3", "final_answer": [], "solution": ["..."]},
        ],
    )
    problems, skipped = load_benchmark("olympiadbench", path)
    assert [(p.uid, p.answer) for p in problems] == [
        ("olympiadbench-1606", "$\\frac{1}{2}$"),
        ("olympiadbench-1607", "3"),
    ]
    assert skipped == Counter({"empty:answer": 1})


# -- multiple-choice layouts -----------------------------------------------------------------------
ARC_ROWS = [
    {
        "id": "Mercury_1",
        "question": "Which is a gas?",
        "choices": {"text": ["rock", "water", "oxygen", "iron"], "label": ["A", "B", "C", "D"]},
        "answerKey": "C",
    },
    {
        "id": "MCAS_2",
        "question": "Pick two.",
        "choices": {"text": ["one", "two", "three", "four"], "label": ["1", "2", "3", "4"]},
        "answerKey": "2",
    },
    {
        "id": "NYSEDREGENTS_3",
        "question": "Three options.",
        "choices": {"text": ["x", "y", "z"], "label": ["A", "B", "C"]},
        "answerKey": "A",
    },
]


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_arc_challenge_numeric_keys_map_to_letters(tmp_path, suffix):
    problems, skipped = load_benchmark("arc_challenge", write(tmp_path, "arc", suffix, ARC_ROWS))
    assert [(p.uid, p.answer) for p in problems] == [
        ("arc_challenge-Mercury_1", "C"),
        ("arc_challenge-MCAS_2", "B"),
        ("arc_challenge-NYSEDREGENTS_3", "A"),
    ]
    assert problems[0].choices == ("rock", "water", "oxygen", "iron")
    assert problems[0].question == "Which is a gas?\nA. rock\nB. water\nC. oxygen\nD. iron"
    assert problems[1].question == "Pick two.\nA. one\nB. two\nC. three\nD. four"
    assert problems[2].choices == ("x", "y", "z")
    assert skipped == Counter()


def gpqa_rows(count):
    return [
        {
            "Record ID": f"rec{i}",
            "Question": f"Question {i}?",
            "Correct Answer": f"right {i}",
            "Incorrect Answer 1": f"wrong {i}a",
            "Incorrect Answer 2": f"wrong {i}b",
            "Incorrect Answer 3": f"wrong {i}c",
            "Subdomain": "Physics",
        }
        for i in range(count)
    ]


def test_gpqa_gold_letter_points_at_the_correct_answer(tmp_path):
    rows = gpqa_rows(4)
    problems, skipped = load_benchmark("gpqa_diamond", write_jsonl(tmp_path / "gpqa.jsonl", rows), seed=3)
    assert skipped == Counter()
    for row, problem in zip(rows, problems, strict=True):
        assert problem.uid == f"gpqa_diamond-{row['Record ID']}"
        assert sorted(problem.choices) == sorted(
            [row["Correct Answer"], row["Incorrect Answer 1"], row["Incorrect Answer 2"], row["Incorrect Answer 3"]]
        )
        assert problem.choices["ABCD".index(problem.answer)] == row["Correct Answer"]
        assert f"\n{problem.answer}. {row['Correct Answer']}" in problem.question
        assert problem.question.startswith(row["Question"] + "\nA. ")


def test_gpqa_shuffle_is_deterministic_per_seed(tmp_path):
    path = write_jsonl(tmp_path / "gpqa.jsonl", gpqa_rows(4))
    first, _ = load_benchmark("gpqa_diamond", path, seed=7)
    again, _ = load_benchmark("gpqa_diamond", path, seed=7)
    assert first == again
    # Seeded per question: the first problem is the same whatever else is read after it.
    assert load_benchmark("gpqa_diamond", path, seed=7, limit=1)[0] == first[:1]
    # Another seed shuffles differently somewhere (the correct answer does not always sit in one place).
    orders = {tuple(p.choices for p in load_benchmark("gpqa_diamond", path, seed=s)[0]) for s in range(6)}
    assert len(orders) > 1
    assert len({p.answer for s in range(6) for p in load_benchmark("gpqa_diamond", path, seed=s)[0]}) > 1


def test_gpqa_csv_with_multiline_question(tmp_path):
    # GPQA is published as CSV; its questions hold newlines inside quotes.
    path = tmp_path / "gpqa_diamond.csv"
    path.write_text(
        "Record ID,Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2,Incorrect Answer 3\n"
        'recA,"Line one.\nLine two?",yes,no,maybe,never\n',
        encoding="utf-8",
    )
    (problem,), _ = load_benchmark("gpqa_diamond", path)
    assert problem.uid == "gpqa_diamond-recA" and problem.question.startswith("Line one.\nLine two?\nA. ")
    assert problem.choices["ABCD".index(problem.answer)] == "yes"


def test_mmlu_pro(tmp_path):
    ten = [f"option {i}" for i in range(10)]
    path = write_parquet(
        tmp_path / "mmlu_pro.parquet",
        [
            {"question_id": 70, "question": "Ten options?", "options": ten, "answer": "J", "answer_index": 9},
            {
                "question_id": 71,
                "question": "Four options?",
                "options": ["a", "b", "c", "d"],
                "answer": "B",
                "answer_index": 1,
            },
            {
                "question_id": 72,
                "question": "Letter past the options?",
                "options": ["a", "b", "c", "d"],
                "answer": "E",
                "answer_index": 4,
            },
        ],
    )
    problems, skipped = load_benchmark("mmlu_pro", path)
    assert [(p.uid, p.answer) for p in problems] == [("mmlu_pro-70", "J"), ("mmlu_pro-71", "B")]
    assert problems[0].choices == tuple(ten) and problems[0].question.endswith("\nJ. option 9")
    assert skipped == Counter({"invalid:answer": 1})


# -- limits and other formats ----------------------------------------------------------------------
def test_limit_keeps_the_first_good_problems(tmp_path):
    path = write_jsonl(
        tmp_path / "minerva.jsonl",
        [{"question": None, "answer": "0"}] + [{"question": f"Q{i}", "answer": str(i)} for i in range(5)],
    )
    problems, skipped = load_benchmark("minerva", path, limit=2)
    assert [p.question for p in problems] == ["Q0", "Q1"] and skipped == Counter({"missing:question": 1})
    assert "limit" in error_of("minerva", path, limit=0)


def test_json_array_file(tmp_path):
    path = tmp_path / "aime25.json"
    path.write_text(json.dumps([{"question": "Q", "answer": "1"}]), encoding="utf-8")
    assert load_benchmark("aime25", path)[0] == [BenchmarkProblem("aime25-0", "Q", "1")]


# -- broken files ----------------------------------------------------------------------------------
def test_bad_rows_are_skipped_and_counted(tmp_path):
    path = tmp_path / "math500.jsonl"
    rows = [
        {"problem": "good 1", "answer": "1", "unique_id": "a"},
        {"problem": None, "answer": "1", "unique_id": "b"},
        {"problem": 5, "answer": "1", "unique_id": "c"},
        {"problem": "  ", "answer": "1", "unique_id": "d"},
        {"problem": "no answer", "answer": None, "unique_id": "e"},
        {"problem": "list answer", "answer": ["1"], "unique_id": "f"},
        {"problem": "repeat", "answer": "1", "unique_id": "a"},
        ["not", "an", "object"],
        {"problem": "good 2", "answer": "2", "unique_id": "g"},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + "{not json\n", encoding="utf-8")
    problems, skipped = load_benchmark("math500", path)
    assert [(p.uid, p.question) for p in problems] == [("math500-a", "good 1"), ("math500-g", "good 2")]
    assert skipped == Counter(
        {
            "missing:question": 1,
            "type:question": 1,
            "empty:question": 1,
            "missing:answer": 1,
            "type:answer": 1,
            "duplicate:id": 1,
            "type:row": 1,
            "invalid:json": 1,
        }
    )


def test_bad_choices_are_skipped(tmp_path):
    bad = [
        {**ARC_ROWS[0], "id": "x1", "choices": {"text": ["a", "b"], "label": ["A"]}},  # lengths differ
        {**ARC_ROWS[0], "id": "x2", "answerKey": "E"},  # no such label
        {**ARC_ROWS[0], "id": "x3", "choices": None},
    ]
    problems, skipped = load_benchmark("arc_challenge", write_jsonl(tmp_path / "arc.jsonl", ARC_ROWS[:1] + bad))
    assert [p.uid for p in problems] == ["arc_challenge-Mercury_1"]
    assert skipped == Counter({"invalid:choices": 2, "invalid:answer": 1})
    rows = gpqa_rows(2)
    rows[1]["Incorrect Answer 2"] = None
    problems, skipped = load_benchmark("gpqa_diamond", write_jsonl(tmp_path / "gpqa.jsonl", rows))
    assert len(problems) == 1 and skipped == Counter({"invalid:choices": 1})


def test_all_rows_bad(tmp_path):
    path = write_jsonl(tmp_path / "aime25.jsonl", [{"question": 1, "answer": "2"}, {"question": "Q", "answer": None}])
    message = error_of("aime25", path)
    assert "all 2 rows were skipped" in message and "missing:answer=1" in message
    assert "type:question=1" in message and str(path) in message


def test_missing_file_names_file_and_columns(tmp_path):
    path = tmp_path / "nowhere" / "gpqa.parquet"
    message = error_of("gpqa_diamond", path)
    assert str(path) in message and "not found" in message and "Idavidrein/gpqa" in message
    for column in ("Question", "Correct Answer", "Incorrect Answer 3"):
        assert column in message


def test_missing_column_names_it_and_the_found_ones(tmp_path):
    path = write_parquet(tmp_path / "aime24.parquet", [{"id": 1, "question": "Q", "answer": "1"}])
    message = error_of("aime24", path)
    assert "no column 'problem'" in message and "['id', 'question', 'answer']" in message
    assert "HuggingFaceH4/aime_2024" in message


def test_unknown_name_lists_the_known_ones(tmp_path):
    message = error_of("aime23", tmp_path / "x.jsonl")
    assert "unknown benchmark 'aime23'" in message
    for name in BENCHMARK_NAMES:
        assert name in message
    assert "builtin_validation" in error_of(BUILTIN, tmp_path / "x.jsonl")


def test_unsupported_extension(tmp_path):
    path = tmp_path / "aime24.txt"
    path.write_text("problem,answer\n", encoding="utf-8")
    message = error_of("aime24", path)
    assert "unsupported extension '.txt'" in message and ".parquet" in message and ".jsonl" in message


def test_unreadable_and_empty_files(tmp_path):
    garbage = tmp_path / "aime24.parquet"
    garbage.write_bytes(b"this is not parquet\nat all\n")
    assert "is not readable as .parquet" in error_of("aime24", garbage)
    empty = tmp_path / "aime24.jsonl"
    empty.write_text("\n", encoding="utf-8")
    assert "has no rows" in error_of("aime24", empty)


# -- the built-in task -----------------------------------------------------------------------------
def test_builtin_validation_is_the_task_validation_split():
    cfg = TaskConfig()
    _, val = load_task(cfg, 0)
    problems = builtin_validation(cfg, 0)
    assert len(problems) == cfg.val_size == len(val)
    assert problems == [BenchmarkProblem(f"arithmetic-{p.uid}", p.question, p.answer) for p in val]
    assert builtin_validation(cfg, 0) == problems and all(p.choices == () for p in problems)


def test_non_finite_gold_answers_are_skipped_and_counted(tmp_path):
    """A gold answer "nan" or "inf" names no value a response could match (math-verify would call a boxed
    nan correct): skipped as invalid, counted, as in a teacher's ground truth."""
    rows = [
        {"problem": "1+1", "answer": "2"},
        {"problem": "0/0", "answer": "nan"},
        {"problem": "1/0", "answer": " -Infinity "},
        {"problem": "x", "answer": "\\infty"},
    ]
    problems, skipped = load_benchmark("math500", write(tmp_path, "math500", ".jsonl", rows))
    assert [p.answer for p in problems] == ["2", "\\infty"] and skipped == Counter({"invalid:answer": 2})
