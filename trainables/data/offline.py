"""The multi-teacher offline store: teacher solutions per prompt, filtered as the OGER paper filters them.

Raw rows are plain dicts, one per (prompt, target):

    {"question": str, "answer": str, "teacher": str, "solution": str}

plus "messages", the (role, content) turns of a file's chat-list prompt, where it has one.

They come from the built-in teachers (`builtin_rows`) or from a LUFFY / OpenR1-style file
(`read_rows`: Parquet or JSONL). `build_store` normalises each solution to begin with `<think>`, then
keeps the rows that fit a token cap and that the online reward's verifier accepts (OGER: a length cap
and a math-verify correctness check over three teachers), and records what the paper's Table 1
reports per teacher. Prompts are keyed by the question text, stripped; `offline_problems` lists the
distinct questions of a set of files (the prompts of task offline_prompts).

Malformed rows never raise: each is skipped and counted under a reason `"<kind>:<field>"`, kind one
of missing / type / empty (plus "invalid:json" and "type:row" for lines that are not objects;
`trainables.data.records`); the filters count "overlong" and "incorrect". Only an empty store raises.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainables.data.arithmetic import TEACHERS, Problem, teacher_dataset
from trainables.data.records import READERS, BadRecord, answer, check_row, file_problem, read_records, suffix_of, text
from trainables.rewards.verify import THINK_OPEN, score_batch

RAW_KEYS = ("question", "answer", "teacher", "solution")
# Our field -> dotted column path in a LUFFY / OpenR1-Math-46k file (LUFFY's released training data).
DEFAULT_COLUMNS: dict[str, str] = {
    "prompt": "prompt",  # a string, or a chat list of {role, content}: the last user turn is the question
    "target": "target",  # a string, a list of strings, or a list of {role, content}: one row per element
    "ground_truth": "reward_model.ground_truth",  # a non-empty string
    "source": "data_source",  # the teacher's name; "offline" where absent
}
DEFAULT_TEACHER = "offline"


@dataclass(frozen=True)
class OfflineTrajectory:
    teacher: str
    text: str  # the response, starting at "<think>"
    num_tokens: int  # by the policy tokenizer's count


@dataclass
class TeacherStats:
    """Running counts for one teacher; the means and the accuracy are derived, never stored."""

    read: int = 0  # well-formed rows
    accepted: int = 0  # rows the verifier accepts, before any filter
    valid: int = 0  # rows kept: accepted and within the token cap
    read_tokens: int = 0
    valid_tokens: int = 0

    @property
    def accuracy_before_filter(self) -> float:
        return self.accepted / self.read if self.read else 0.0

    @property
    def mean_tokens_read(self) -> float:
        return self.read_tokens / self.read if self.read else 0.0

    @property
    def mean_tokens_valid(self) -> float:
        return self.valid_tokens / self.valid if self.valid else 0.0


# -- sources of raw rows ---------------------------------------------------------------------------
def builtin_rows(
    problems: Sequence[Problem],
    *,
    teachers: Sequence[str] = tuple(TEACHERS),
    seed: int,
    wrong_rate: float,
    overlong_rate: float,
) -> list[dict[str, str]]:
    """Raw rows [len(problems) * len(teachers)] from the built-in teachers (wrong / over-long ones included)."""
    rows = teacher_dataset(problems, seed, teachers=teachers, wrong_rate=wrong_rate, overlong_rate=overlong_rate)
    return [{key: row[key] for key in RAW_KEYS} for row in rows]


def _lookup(record: Mapping[str, Any], path: str) -> Any:
    """record[path] if a flat column has that name, else the walk down its dots; None if absent or null."""
    if path in record:
        value = record[path]
    else:
        value = record
        for part in path.split("."):
            if not isinstance(value, Mapping) or part not in value:
                return None
            value = value[part]
    return value


def _prompt_text(value: Any) -> str:
    """The question: the string itself, or the content of a chat list's last user turn."""
    if isinstance(value, list):
        users = [turn for turn in value if isinstance(turn, Mapping) and turn.get("role") == "user"]
        value = users[-1].get("content") if users else None
    return text(value, "prompt")


def _prompt_turns(value: Any) -> tuple[tuple[str, str], ...]:
    """A chat-list prompt whole, as (role, content) turns (the `dataset` template keeps its system turn);
    () for a string prompt. Every turn must be a {role, content} of strings, else "type:prompt"."""
    if not isinstance(value, list):
        return ()
    turns = tuple((turn.get("role"), turn.get("content")) for turn in value if isinstance(turn, Mapping))
    if len(turns) != len(value) or not all(isinstance(r, str) and isinstance(c, str) for r, c in turns):
        raise BadRecord("type:prompt")
    return turns


def _target_items(value: Any) -> list[Any]:
    """The targets of a row: [value] for a string, the elements of a list (each one row)."""
    if value is None:
        raise BadRecord("missing:target")
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise BadRecord("type:target")
    if not value:
        raise BadRecord("empty:target")
    return value


def _target_text(item: Any) -> str:
    """One target: a string, or a {role, content} message's content."""
    if isinstance(item, Mapping):
        item = item.get("content")
    return text(item, "target")


def _source(value: Any) -> str:
    """The teacher's name; DEFAULT_TEACHER where the column is absent, null or empty."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return DEFAULT_TEACHER
    if not isinstance(value, str):
        raise BadRecord("type:source")
    return value.strip()


def _record_rows(record: Any, columns: Mapping[str, str]) -> tuple[list[dict[str, str]], Counter]:
    """Raw rows [number of good targets] of one file record, and the skip counts of the bad parts."""
    try:  # a bad prompt, ground truth or source loses the whole record: count it once
        record = check_row(record)
        prompt = _lookup(record, columns["prompt"])
        question, turns = _prompt_text(prompt), _prompt_turns(prompt)
        gold = answer(_lookup(record, columns["ground_truth"]), "ground_truth")
        teacher = _source(_lookup(record, columns["source"]))
        items = _target_items(_lookup(record, columns["target"]))
    except BadRecord as bad:
        return [], Counter({bad.reason: 1})
    rows, skipped = [], Counter()
    for item in items:  # a bad target loses only itself
        try:
            rows.append(
                {
                    "question": question,
                    "answer": gold,
                    "teacher": teacher,
                    "solution": _target_text(item),
                    **({"messages": turns} if turns else {}),
                }
            )
        except BadRecord as bad:
            skipped[bad.reason] += 1
    return rows, skipped


def _resolve_columns(columns: Mapping[str, str] | None) -> dict[str, str]:
    """DEFAULT_COLUMNS with `columns` laid over it; unknown names raise with the known ones."""
    unknown = sorted(set(columns or {}) - set(DEFAULT_COLUMNS))
    if unknown:
        raise ValueError(
            f"unknown offline column names {unknown}; the mapping's keys are {sorted(DEFAULT_COLUMNS)} "
            f"(defaults {DEFAULT_COLUMNS})"
        )
    return {**DEFAULT_COLUMNS, **(columns or {})}


def read_rows(path: str | Path, columns: Mapping[str, str] | None = None) -> tuple[list[dict[str, str]], Counter]:
    """(raw rows, skip counts by reason) from a Parquet or JSONL file in LUFFY / OpenR1 layout.

    The format follows the suffix (`records.READERS`: .parquet, .jsonl, .json-lines, .json, .csv). `columns`
    maps our field names to dotted column paths, overriding any of the defaults (DEFAULT_COLUMNS):

        prompt       -> "prompt"                     string, or chat list: last user turn's content is the
                                                     question, the whole list the row's "messages"
        target       -> "target"                     string, list of strings, or list of {role, content}
        ground_truth -> "reward_model.ground_truth"  non-empty string (nested dict in Parquet / JSON)
        source       -> "data_source"                teacher name; "offline" where absent

    Every element of a target list is one row. Malformed records are skipped and counted; a file with no
    usable row, or that is not of its format (empty, not UTF-8, not Parquet), raises ValueError naming it.
    """
    path = Path(path)
    if suffix_of(path) is None:
        raise ValueError(f"offline data file {str(path)!r} has an unknown suffix; use one of {sorted(READERS)}")
    if not path.is_file():
        raise FileNotFoundError(f"offline data file {str(path)!r} does not exist; check the path in the spec")
    mapping = _resolve_columns(columns)
    rows, skipped = [], Counter()
    try:
        for record in read_records(path):
            good, bad = _record_rows(record, mapping)
            rows += good
            skipped += bad
    except (OSError, ValueError, RecursionError) as e:  # pyarrow's ArrowInvalid, JSON's and UTF-8's: ValueErrors
        raise ValueError(f"offline data file {str(path)!r} is {file_problem(path, e)}") from None
    if not rows and path.stat().st_size == 0:
        raise ValueError(f"offline data file {str(path)!r} is empty (0 bytes)")
    if not rows:
        raise ValueError(
            f"offline data file {str(path)!r} yields no usable row (skipped: {dict(skipped) or 'no rows in it'})"
        )
    return rows, skipped


def offline_problems(files: Sequence[tuple[str | Path, Mapping[str, str] | None]], limit: int) -> list[Problem]:
    """The distinct questions of the offline files (path, columns) with their ground truths: the first
    `limit`, in file order, each with the chat list of its first row."""
    first: dict[str, dict] = {}
    for path, columns in files:
        for row in read_rows(path, columns)[0]:
            first.setdefault(row["question"].strip(), row)  # as the store keys them; the first row's chat list
    questions = list(first)[:limit]
    return [
        Problem(
            f"offline-{i}",
            question,
            first[question]["answer"].strip(),
            level=0,
            messages=first[question].get("messages", ()),
        )
        for i, question in enumerate(questions)
    ]


# -- filtering -------------------------------------------------------------------------------------
def normalise_target(text: str) -> str:
    """The response as our prompts expect it, opening with "<think>".

    LUFFY strips a leading "<think>\\n" from its targets: put "<think>" back where it is missing, and
    drop the newline right after it, so both spellings give the same text.
    """
    if text.startswith(THINK_OPEN + "\n"):
        return THINK_OPEN + text[len(THINK_OPEN) + 1 :]
    return text if text.startswith(THINK_OPEN) else THINK_OPEN + text


def _raw_row_problem(row: Any) -> str | None:
    """The skip reason of a malformed raw row ("missing:answer", "type:solution", ...), else None."""
    if not isinstance(row, Mapping):
        return "type:row"
    for key in RAW_KEYS:
        if row.get(key) is None:
            return f"missing:{key}"
        if not isinstance(row[key], str):
            return f"type:{key}"
        if not row[key].strip():
            return f"empty:{key}"
    return None


def _well_formed(rows: Iterable[Any], skipped: Counter) -> list[dict[str, str]]:
    """The usable raw rows, solutions normalised, teacher names stripped; counts the rest in `skipped`."""
    kept = []
    for row in rows:
        reason = _raw_row_problem(row)
        if reason is not None:
            skipped[reason] += 1
            continue
        kept.append({**row, "teacher": row["teacher"].strip(), "solution": normalise_target(row["solution"])})
    return kept


def _empty_store_message(
    given: int, well_formed: int, max_tokens: int, skipped: Counter, reasons: Mapping[str, int]
) -> str:
    """One line: what was read, why all of it was dropped, what to check."""
    dropped = ", ".join(f"{k}={v}" for k, v in sorted(skipped.items())) or "nothing"
    verdicts = ", ".join(f"{k}={v}" for k, v in sorted(reasons.items()) if v) or "none"
    return (
        f"the offline store is empty: {given} rows given, {well_formed} well-formed, 0 kept "
        f"(dropped: {dropped}; verifier: {verdicts}); check max_tokens={max_tokens} against the teachers' "
        "lengths, that solutions box the answer after </think>, and the column mapping / ground truths"
    )


def build_store(
    rows: Iterable[Any],
    *,
    count_tokens: Callable[[str], int],
    max_tokens: int,
    score: Callable[[Sequence[str], Sequence[str]], tuple[list[float], Mapping[str, int]]] = score_batch,
    skipped: Mapping[str, int] | None = None,
) -> OfflineStore:
    """The store of the raw rows that fit `max_tokens` and that `score` accepts.

    count_tokens: the policy tokenizer's token count of a response; a row over `max_tokens` is
    "overlong" (checked first: a row both over-long and wrong counts as "overlong"). score: the online
    reward's verifier, (responses [B], golds [B]) -> (rewards [B], reason counts); reward 0 is
    "incorrect". Every well-formed row is scored, the over-long ones too, because Table 1's accuracy
    is before filtering. `skipped`: counts already made (read_rows'), carried into the store.
    Raises ValueError, one line, when no row survives.
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be > 0, got {max_tokens}; set the offline length cap in tokens")
    rows = list(rows)
    skipped = Counter(skipped or {})
    kept = _well_formed(rows, skipped)
    rewards, reasons = score([r["solution"] for r in kept], [r["answer"] for r in kept])
    by_prompt, stats = defaultdict(list), {}
    for row, reward in zip(kept, rewards, strict=True):
        num_tokens = count_tokens(row["solution"])
        teacher = stats.setdefault(row["teacher"], TeacherStats())
        teacher.read, teacher.read_tokens = teacher.read + 1, teacher.read_tokens + num_tokens
        teacher.accepted += int(reward > 0)
        verdict = "overlong" if num_tokens > max_tokens else "incorrect" if reward <= 0 else None
        if verdict is not None:
            skipped[verdict] += 1
            continue
        teacher.valid, teacher.valid_tokens = teacher.valid + 1, teacher.valid_tokens + num_tokens
        by_prompt[row["question"].strip()].append(OfflineTrajectory(row["teacher"], row["solution"], num_tokens))
    if not by_prompt:
        raise ValueError(_empty_store_message(len(rows), len(kept), max_tokens, skipped, reasons))
    return OfflineStore(dict(by_prompt), stats, skipped, reasons)


# -- the store -------------------------------------------------------------------------------------
TABLE_COLUMNS = (  # (key in teacher_table rows, header in format_table)
    ("teacher", "teacher"),
    ("read", "read"),
    ("valid", "valid"),
    ("mean_tokens_read", "avg tokens (read)"),
    ("mean_tokens_valid", "avg tokens (valid)"),
    ("accuracy_before_filter", "accuracy before filter"),
)


class OfflineStore:
    """Teacher trajectories by prompt (question text, stripped), with the filter's statistics."""

    def __init__(
        self,
        by_prompt: dict[str, list[OfflineTrajectory]],
        stats: dict[str, TeacherStats],
        skipped: Counter,
        verifier_reasons: Mapping[str, int],
    ):
        self._by_prompt = by_prompt
        self.stats = stats  # teacher -> TeacherStats, in the order teachers were first read
        self.skipped = skipped  # reason -> rows dropped (malformed, "overlong", "incorrect")
        self.verifier_reasons = dict(verifier_reasons)  # the verifier's reasons over every well-formed row

    def for_prompt(self, question: str) -> list[OfflineTrajectory]:
        """The trajectories of `question` (matched stripped); [] for a prompt the store lacks."""
        return list(self._by_prompt.get(question.strip(), ()))

    def __len__(self) -> int:
        return sum(len(trajectories) for trajectories in self._by_prompt.values())

    @property
    def prompts(self) -> set[str]:
        return set(self._by_prompt)

    def teacher_table(self) -> list[dict[str, Any]]:
        """OGER Table 1, one dict per teacher: read, valid, mean tokens (read / valid), accuracy before filter."""
        return [
            {
                "teacher": name,
                "read": s.read,
                "valid": s.valid,
                "mean_tokens_read": s.mean_tokens_read,
                "mean_tokens_valid": s.mean_tokens_valid,
                "accuracy_before_filter": s.accuracy_before_filter,
            }
            for name, s in self.stats.items()
        ]

    def metrics(self) -> dict[str, float]:
        """Flat metrics: offline/<teacher>/{read,valid,mean_tokens,mean_tokens_read,accuracy_before_filter},
        offline/skipped/<reason>, offline/verifier/<reason>, offline/trajectories, offline/prompts."""
        out = {"offline/trajectories": float(len(self)), "offline/prompts": float(len(self._by_prompt))}
        for row in self.teacher_table():
            prefix = f"offline/{row['teacher']}"
            out |= {
                f"{prefix}/read": float(row["read"]),
                f"{prefix}/valid": float(row["valid"]),
                f"{prefix}/mean_tokens": row["mean_tokens_valid"],
                f"{prefix}/mean_tokens_read": row["mean_tokens_read"],
                f"{prefix}/accuracy_before_filter": row["accuracy_before_filter"],
            }
        out |= {f"offline/skipped/{reason}": float(n) for reason, n in sorted(self.skipped.items())}
        out |= {f"offline/verifier/{reason}": float(n) for reason, n in self.verifier_reasons.items()}
        return out

    def format_table(self) -> str:
        """The teacher table as plain text, then the skip counts, for printing."""
        cells = [[header for _, header in TABLE_COLUMNS]]
        for row in self.teacher_table():
            cells.append(
                [
                    row["teacher"],
                    str(row["read"]),
                    str(row["valid"]),
                    f"{row['mean_tokens_read']:.1f}",
                    f"{row['mean_tokens_valid']:.1f}",
                    f"{row['accuracy_before_filter']:.1%}",
                ]
            )
        widths = [max(len(line[i]) for line in cells) for i in range(len(TABLE_COLUMNS))]
        lines = [
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
            for line in cells
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        skipped = ", ".join(f"{k}={v}" for k, v in sorted(self.skipped.items())) or "none"
        return "\n".join(lines + [f"{len(self)} trajectories over {len(self._by_prompt)} prompts; skipped: {skipped}"])
