"""The multi-teacher offline store: reading LUFFY-layout files, the length / correctness filters, Table 1."""

import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainables.data.arithmetic import make_splits, teacher_dataset
from trainables.data.offline import (
    DEFAULT_COLUMNS,
    OfflineTrajectory,
    build_store,
    builtin_rows,
    normalise_target,
    read_rows,
)


def words(text: str) -> int:
    """The tests' tokenizer: whitespace-separated pieces."""
    return len(text.split())


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def table_by_teacher(store) -> dict[str, dict]:
    return {row["teacher"]: row for row in store.teacher_table()}


# -- normalisation ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "raw, expected",
    [
        ("<think>\nx</think>\\boxed{1}", "<think>x</think>\\boxed{1}"),  # LUFFY's spelling: drop the newline
        ("x</think>\\boxed{1}", "<think>x</think>\\boxed{1}"),  # stripped "<think>\n": put "<think>" back
        ("<think>x</think>\\boxed{1}", "<think>x</think>\\boxed{1}"),  # already ours
        ("<think>\n\nx</think>", "<think>\nx</think>"),  # only the one newline LUFFY's strip took
    ],
)
def test_normalise_target(raw, expected):
    assert normalise_target(raw) == expected


def test_store_normalises_before_verifying():
    # Without "<think>" the verifier says no_think: the store must normalise first, then score.
    rows = [
        {"question": "1+2", "answer": "3", "teacher": "t", "solution": "<think>\nOne plus two.</think>\\boxed{3}"},
        {"question": "1+2", "answer": "3", "teacher": "t", "solution": "Three.</think>\\boxed{3}"},
    ]
    store = build_store(rows, count_tokens=words, max_tokens=100)
    assert [t.text for t in store.for_prompt("1+2")] == [
        "<think>One plus two.</think>\\boxed{3}",
        "<think>Three.</think>\\boxed{3}",
    ]
    assert store.skipped == Counter()


# -- built-in teachers ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def builtin_case():
    # Levels 1-2: every over-long solution is longer (in words) than every other one, so one cap
    # separates them exactly (checked below, not assumed).
    problems, _ = make_splits(0, [1, 2], train_size=40, val_size=0)
    kwargs = dict(teachers=("terse", "stepwise", "verbose"), wrong_rate=0.2, overlong_rate=0.2)
    reference = teacher_dataset(problems, 7, **kwargs)
    rows = builtin_rows(problems, seed=7, **kwargs)
    cap = max(words(r["solution"]) for r in reference if r["kind"] != "overlong")
    assert min(words(r["solution"]) for r in reference if r["kind"] == "overlong") > cap
    return reference, rows, cap, build_store(rows, count_tokens=words, max_tokens=cap)


def test_builtin_rows_are_the_teacher_dataset(builtin_case):
    reference, rows, _, _ = builtin_case
    assert rows == [{k: r[k] for k in ("question", "answer", "teacher", "solution")} for r in reference]


def test_builtin_store_keeps_exactly_the_correct_short_rows(builtin_case):
    reference, _, _, store = builtin_case
    kinds = Counter(r["kind"] for r in reference)
    assert kinds["wrong"] > 0 and kinds["overlong"] > 0 and kinds["correct"] > 0
    assert store.skipped == Counter({"incorrect": kinds["wrong"], "overlong": kinds["overlong"]})
    assert len(store) == kinds["correct"]
    for question in {r["question"] for r in reference}:
        expected = [
            OfflineTrajectory(r["teacher"], r["solution"], words(r["solution"]))
            for r in reference
            if r["question"] == question and r["kind"] == "correct"
        ]
        assert store.for_prompt(question) == expected
    assert store.prompts == {r["question"] for r in reference if r["kind"] == "correct"}
    # The verifier saw every row, over-long ones included (they are correct).
    assert store.verifier_reasons["wrong"] == kinds["wrong"]
    assert store.verifier_reasons["correct"] == kinds["correct"] + kinds["overlong"]


def test_builtin_teacher_table(builtin_case):
    reference, _, _, store = builtin_case
    table = table_by_teacher(store)
    assert list(table) == ["terse", "stepwise", "verbose"]
    for teacher, row in table.items():
        mine = [r for r in reference if r["teacher"] == teacher]
        valid = [r for r in mine if r["kind"] == "correct"]
        assert row["read"] == len(mine)
        assert row["valid"] == len(valid)
        assert row["mean_tokens_read"] == pytest.approx(mean(words(r["solution"]) for r in mine))
        assert row["mean_tokens_valid"] == pytest.approx(mean(words(r["solution"]) for r in valid))
        assert row["accuracy_before_filter"] == pytest.approx(mean(r["kind"] != "wrong" for r in mine))
    metrics = store.metrics()
    assert metrics["offline/trajectories"] == len(store)
    assert metrics["offline/terse/valid"] == table["terse"]["valid"]
    assert metrics["offline/verbose/mean_tokens"] == pytest.approx(table["verbose"]["mean_tokens_valid"])
    assert metrics["offline/stepwise/accuracy_before_filter"] == pytest.approx(
        table["stepwise"]["accuracy_before_filter"]
    )
    assert metrics["offline/skipped/overlong"] == store.skipped["overlong"]
    text = store.format_table()
    assert all(name in text for name in ("terse", "stepwise", "verbose", "accuracy before filter", "overlong="))


# -- LUFFY-layout files -------------------------------------------------------------------------------
def chat(user: str) -> list[dict]:
    """A chat prompt with a system turn and an earlier user turn: the last user turn is the question."""
    return [
        {"role": "system", "content": "Think, then box."},
        {"role": "user", "content": "an earlier turn"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": user},
    ]


def message(text: str) -> dict:
    return {"role": "assistant", "content": text}


def luffy(prompt, target, gold, source=None) -> dict:
    record = {"prompt": prompt, "target": target, "reward_model": {"ground_truth": gold}}
    return record if source is None else {**record, "data_source": source}


LONG = "<think>" + "and again " * 30 + "</think>\\boxed{9}"
# (normalised text, teacher) of every trajectory the fixture should keep, per question.
KEPT = {
    "What is 2+3?": [("<think>Two plus three is five.</think> \\boxed{5}", "r1")],
    "What is 4+4?": [
        ("<think>Four and four.</think> So \\boxed{8}", "qwen"),
        ("<think>Eight, since 4*2=8.</think> The answer is \\boxed{8}.", "qwen"),
    ],
    "What is 1+1?": [("<think>One and one.</think> \\boxed{2}", "offline")],
    "What is 3*2?": [("<think>Three twice.</think> \\boxed{6}", "r1")],
}
WRONG = "<think>Seven threes are twenty.</think> \\boxed{20}"


def jsonl_records() -> list:
    return [
        luffy(chat("What is 2+3?"), [message("<think>\nTwo plus three is five.</think> \\boxed{5}")], "5", "r1"),
        luffy(
            "  What is 4+4? ",
            [
                "Four and four.</think> So \\boxed{8}",  # two targets in one row
                "<think>\nEight, since 4*2=8.</think> The answer is \\boxed{8}.",
            ],
            "8",
            "qwen",
        ),
        {"target": [message("<think>x</think>\\boxed{1}")], "reward_model": {"ground_truth": "1"}},  # no prompt
        luffy("What is 5+5?", 42, "10", "r1"),  # target of the wrong type
        luffy("What is 6+6?", "<think>12</think>\\boxed{12}", "", "r1"),  # empty ground truth
        luffy("What is 7*3?", [message(WRONG)], "21", "r1"),  # a wrong answer
        luffy("What is 4+5?", [message(LONG)], "9", "qwen"),  # over the cap
        luffy("What is 1+1?", "<think>One and one.</think> \\boxed{2}", "2"),  # no data_source
        luffy("What is 3*2?", [message("<think>Three twice.</think> \\boxed{6}"), {"role": "assistant"}], "6", "r1"),
    ]


def write_jsonl(path, records, extra_lines=()):
    lines = [json.dumps(r) for r in records] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    return path


def check_kept(store):
    for question, expected in KEPT.items():
        assert [(t.text, t.teacher) for t in store.for_prompt(question)] == expected
        assert all(t.num_tokens == words(t.text) for t in store.for_prompt(question))
    assert store.prompts == set(KEPT)
    assert store.for_prompt("What is 7*3?") == [] and store.for_prompt("never seen") == []


def kept_texts(teacher: str) -> list[str]:
    return [text for kept in KEPT.values() for text, who in kept if who == teacher]


# Each teacher's well-formed rows: r1 also wrote the wrong one, qwen the over-long (correct) one.
READ_TEXTS = {"r1": kept_texts("r1") + [WRONG], "qwen": kept_texts("qwen") + [LONG], "offline": kept_texts("offline")}
ACCEPTED = {"r1": 2, "qwen": 3, "offline": 1}  # rows of each teacher the verifier accepts, before the cap


def check_table(store):
    """Table 1 against values worked out here from the fixture's texts."""
    table = table_by_teacher(store)
    assert set(table) == set(READ_TEXTS)
    for teacher, texts in READ_TEXTS.items():
        valid = kept_texts(teacher)
        row = table[teacher]
        assert (row["read"], row["valid"]) == (len(texts), len(valid))
        assert row["mean_tokens_read"] == pytest.approx(mean(map(words, texts)))
        assert row["mean_tokens_valid"] == pytest.approx(mean(map(words, valid)))
        assert row["accuracy_before_filter"] == pytest.approx(ACCEPTED[teacher] / len(texts))


def test_jsonl_luffy_layout(tmp_path):
    path = write_jsonl(tmp_path / "teachers.jsonl", jsonl_records(), extra_lines=["{not json", "[1, 2]"])
    rows, skipped = read_rows(path)
    assert skipped == Counter(
        {
            "missing:prompt": 1,
            "type:target": 1,
            "empty:ground_truth": 1,
            "missing:target": 1,
            "invalid:json": 1,
            "type:row": 1,
        }
    )
    assert len(rows) == 7  # 1 + 2 + wrong + long + 1 + 1 good of the last row
    store = build_store(rows, count_tokens=words, max_tokens=20, skipped=skipped)
    assert store.skipped == skipped + Counter({"incorrect": 1, "overlong": 1})
    check_kept(store)
    check_table(store)
    assert store.metrics()["offline/skipped/missing:prompt"] == 1


def parquet_records() -> list:
    """LUFFY's typed schema (chat-list prompt, list<struct> target): the bad rows Parquet can hold."""
    return [
        luffy(chat("What is 2+3?"), [message("<think>\nTwo plus three is five.</think> \\boxed{5}")], "5", "r1"),
        luffy(
            chat("What is 4+4?"),
            [
                message("Four and four.</think> So \\boxed{8}"),
                message("<think>\nEight, since 4*2=8.</think> The answer is \\boxed{8}."),
            ],
            "8",
            "qwen",
        ),
        luffy(None, [message("<think>x</think>\\boxed{1}")], "1", "r1"),  # null prompt
        luffy(chat("What is 5+5?"), [], "10", "r1"),  # no target
        luffy(chat("What is 6+6?"), [message("<think>12</think>\\boxed{12}")], "", "r1"),  # empty ground truth
        luffy(chat("What is 7*3?"), [message(WRONG)], "21", "r1"),
        luffy(chat("What is 4+5?"), [message(LONG)], "9", "qwen"),
        luffy(chat("What is 1+1?"), [message("<think>One and one.</think> \\boxed{2}")], "2", None),  # null source
        luffy(chat("What is 3*2?"), [message("<think>Three twice.</think> \\boxed{6}"), message("  ")], "6", "r1"),
    ]


def test_parquet_luffy_layout(tmp_path):
    records = [
        {**r, "data_source": r.get("data_source"), "extra_info": {"index": i}} for i, r in enumerate(parquet_records())
    ]
    path = tmp_path / "teachers.parquet"
    pq.write_table(pa.Table.from_pylist(records), path)
    rows, skipped = read_rows(path)
    assert skipped == Counter({"missing:prompt": 1, "empty:target": 2, "empty:ground_truth": 1})
    store = build_store(rows, count_tokens=words, max_tokens=20, skipped=skipped)
    assert store.skipped == skipped + Counter({"incorrect": 1, "overlong": 1})
    check_kept(store)
    check_table(store)
    # A dotted override reaching a column of the wrong type: every row is "type:target", and a file with no
    # usable row is refused, its counts named. The null-prompt and empty-ground-truth rows are lost to those
    # fields first (checked before target).
    with pytest.raises(ValueError, match="yields no usable row") as refused:
        read_rows(path, columns={"target": "extra_info.index"})
    for reason, count in {"type:target": len(records) - 2, "missing:prompt": 1, "empty:ground_truth": 1}.items():
        assert f"'{reason}': {count}" in str(refused.value)


def test_every_format_gives_the_same_rows(tmp_path):
    """One reader (trainables.data.records) for the offline store and the benchmarks: the same records
    as Parquet, JSON lines and a JSON array give the same rows and skip counts."""
    records = parquet_records()
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "t.parquet")
    write_jsonl(tmp_path / "t.jsonl", records)
    (tmp_path / "t.json").write_text(json.dumps(records), encoding="utf-8")
    read = [read_rows(tmp_path / name) for name in ("t.parquet", "t.jsonl", "t.json")]
    assert read[0][1] == Counter({"missing:prompt": 1, "empty:target": 2, "empty:ground_truth": 1})
    assert read[0] == read[1] == read[2]


def test_column_mapping_reads_another_layout(tmp_path):
    records = [
        {"problem": "What is 2+3?", "solution": "<think>Five.</think> \\boxed{5}", "answer": "5", "model": "glm"},
        {"problem": "What is 2+2?", "solution": "<think>Four.</think> \\boxed{4}"},
    ]
    path = write_jsonl(tmp_path / "custom.json-lines", records)
    columns = {"prompt": "problem", "target": "solution", "ground_truth": "answer", "source": "model"}
    rows, skipped = read_rows(path, columns=columns)
    assert rows == [
        {"question": "What is 2+3?", "answer": "5", "teacher": "glm", "solution": "<think>Five.</think> \\boxed{5}"}
    ]
    assert skipped == Counter({"missing:ground_truth": 1})
    with pytest.raises(ValueError, match="unknown offline column names \\['answer'\\]"):
        read_rows(path, columns={"answer": "answer"})
    assert set(DEFAULT_COLUMNS) == {"prompt", "target", "ground_truth", "source"}


# -- errors ---------------------------------------------------------------------------------------
def test_unknown_suffix_and_missing_file(tmp_path):
    (tmp_path / "teachers.txt").write_text("prompt,target\n")
    with pytest.raises(ValueError, match=r"teachers\.txt.*\.jsonl.*\.parquet"):
        read_rows(tmp_path / "teachers.txt")
    with pytest.raises(FileNotFoundError, match=r"absent\.parquet"):
        read_rows(tmp_path / "absent.parquet")


def test_malformed_raw_rows_are_counted():
    good = {"question": "2+2", "answer": "4", "teacher": "t", "solution": "<think>4</think>\\boxed{4}"}
    rows = [
        good,
        {"answer": "4", "teacher": "t", "solution": "x"},
        {**good, "solution": 4},
        {**good, "teacher": " "},
        "not a row",
    ]
    store = build_store(rows, count_tokens=words, max_tokens=10)
    assert store.skipped == Counter({"missing:question": 1, "type:solution": 1, "empty:teacher": 1, "type:row": 1})
    assert len(store) == 1


@pytest.mark.parametrize("max_tokens, reason", [(100, "incorrect=2"), (1, "overlong=2")])
def test_empty_store_raises_one_line(max_tokens, reason):
    rows = [
        {"question": "2+2", "answer": "5", "teacher": "t", "solution": "<think>two and two</think> \\boxed{4}"},
        {"question": "2+3", "answer": "6", "teacher": "t", "solution": "<think>two and three</think> \\boxed{5}"},
        {"question": "2+3", "teacher": "t"},
    ]
    with pytest.raises(ValueError) as error:
        build_store(rows, count_tokens=words, max_tokens=max_tokens)
    text = str(error.value)
    assert "\n" not in text
    assert "3 rows given, 2 well-formed, 0 kept" in text
    assert reason in text and "missing:answer=1" in text and f"max_tokens={max_tokens}" in text


def test_max_tokens_must_be_positive():
    with pytest.raises(ValueError, match="max_tokens must be > 0"):
        build_store([], count_tokens=words, max_tokens=0)


def test_offline_prompts_task_trains_on_the_teachers_questions(tmp_path):
    from trainables.config import TrialConfig
    from trainables.tasks import train_problems

    path = write_jsonl(tmp_path / "teachers.jsonl", jsonl_records())
    cfg = TrialConfig.model_validate(
        {
            "task": {"name": "offline_prompts", "train_size": 4},
            "offline": {"teachers": [], "files": [{"path": str(path)}]},
            "validation": {"benchmarks": {"aime24": str(tmp_path / "aime24.jsonl")}},
        }
    )
    problems = train_problems(cfg)
    # Distinct questions of well-formed records, in file order; each with its ground truth, capped.
    assert [(p.question, p.answer) for p in problems] == [
        ("What is 2+3?", "5"),
        ("What is 4+4?", "8"),
        ("What is 7*3?", "21"),
        ("What is 4+5?", "9"),
    ]
    assert len({p.uid for p in problems}) == 4


@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("t.jsonl", b"", "is empty (0 bytes)"),
        ("t.parquet", b"", "is empty (0 bytes)"),
        ("t.jsonl", b"\n\n", "yields no usable row"),
        ("t.jsonl", b'{"prompt": "\xff"}\n', "is not UTF-8 text"),
        ("t.parquet", b"PAR1 not a parquet file", "is not readable as .parquet"),
    ],
)
def test_a_data_file_that_gives_nothing_is_refused_by_name(tmp_path, name, content, expected):
    """The Python reader says what the command line says: the file by name and its own problem, one line."""
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError) as refused:
        read_rows(path)
    message = str(refused.value)
    assert expected in message and str(path) in message and "\n" not in message, message


def test_a_non_finite_ground_truth_is_skipped_and_counted(tmp_path):
    rows = [
        {"prompt": "1+1", "target": "<think>2</think> \\boxed{2}", "reward_model": {"ground_truth": "2"}},
        {"prompt": "0/0", "target": "<think>nan</think> \\boxed{nan}", "reward_model": {"ground_truth": "nan"}},
        {"prompt": "1/0", "target": "<think>inf</think> \\boxed{inf}", "reward_model": {"ground_truth": "inf"}},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    kept, skipped = read_rows(path)
    assert [r["answer"] for r in kept] == ["2"] and skipped == Counter({"invalid:ground_truth": 2})
