"""The one reader of data files (benchmarks, offline trajectories): records by the file's suffix.

A record is what one row of the file holds (a dict for a well-formed row). A JSON line that does not
parse is `INVALID_JSON`, so that a caller counts it and goes on. A record, or a part of one, that a
caller cannot use raises `BadRecord` with its reason, "<kind>:<field>": missing, type and empty from
`text`; invalid:json and type:row for a line that is not an object (`check_row`); callers add their own
(invalid:choices, duplicate:id, overlong, ...).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

PARQUET_BATCH_ROWS = 1024  # read Parquet in batches: long targets make a whole table large in memory
INVALID_JSON = object()  # a JSON line that does not parse


class BadRecord(Exception):
    """A record (or one part of it) that cannot be used; `reason` is its skip-count key."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def text(value: Any, field: str) -> str:
    """`value` as given if it is a non-empty string, else BadRecord("missing|type|empty:<field>") (None: missing)."""
    if value is None:
        raise BadRecord(f"missing:{field}")
    if not isinstance(value, str):
        raise BadRecord(f"type:{field}")
    if not value.strip():
        raise BadRecord(f"empty:{field}")
    return value


def answer(value: Any, field: str) -> str:
    """A gold answer's text (`text`, stripped), or BadRecord("invalid:<field>") for one that names no value
    a response could match: "nan", "inf" and the other spellings Python reads as a non-finite float."""
    value = text(value, field).strip()
    try:
        finite = math.isfinite(float(value))
    except ValueError:  # not a number: an expression, a word, a letter
        return value
    if not finite:
        raise BadRecord(f"invalid:{field}")
    return value


def check_row(record: Any) -> Mapping[str, Any]:
    """The record as a row object, or BadRecord("invalid:json" | "type:row")."""
    if record is INVALID_JSON:
        raise BadRecord("invalid:json")
    if not isinstance(record, Mapping):
        raise BadRecord("type:row")
    return record


def _json(line: str) -> Any:
    try:
        return json.loads(line)
    except (json.JSONDecodeError, RecursionError):  # RecursionError: nested deeper than Python's stack
        return INVALID_JSON


def _json_lines(path: Path) -> Iterator[Any]:
    with path.open(encoding="utf-8") as lines:
        yield from (_json(line) for line in lines if line.strip())  # blank lines (a trailing newline) are not rows


def _json_file(path: Path) -> Iterator[Any]:
    """One JSON array of row objects (a file opening with "["), else JSON lines."""
    text_ = path.read_text(encoding="utf-8")
    if text_.lstrip().startswith("["):
        yield from json.loads(text_)
    else:
        yield from (_json(line) for line in text_.splitlines() if line.strip())


def _parquet(path: Path) -> Iterator[Any]:
    import pyarrow.parquet as pq  # only where a Parquet file is read

    for batch in pq.ParquetFile(path).iter_batches(batch_size=PARQUET_BATCH_ROWS):
        yield from batch.to_pylist()  # struct columns come back as nested dicts


def _csv(path: Path) -> Iterator[Any]:
    import pyarrow.csv as pa_csv

    # GPQA is published as CSV, and its questions span several lines inside quotes.
    yield from pa_csv.read_csv(path, parse_options=pa_csv.ParseOptions(newlines_in_values=True)).to_pylist()


# Suffix -> reader of that format's records; a caller's error for any other suffix lists these keys.
READERS: dict[str, Callable[[Path], Iterator[Any]]] = {
    ".parquet": _parquet,
    ".jsonl": _json_lines,
    ".json-lines": _json_lines,
    ".json": _json_file,
    ".csv": _csv,
}


def suffix_of(path: Path) -> str | None:
    """The key of READERS that the file's name ends with (any case), or None."""
    return next((suffix for suffix in READERS if path.name.lower().endswith(suffix)), None)


def read_records(path: Path) -> Iterator[Any]:
    """The file's records, in file order (streamed where the format allows); its suffix is one of READERS.
    Raises OSError or ValueError (pyarrow's, JSON's, UTF-8's) where the file is not of its format."""
    return READERS[suffix_of(path)](path)


def file_problem(path: Path, error: BaseException) -> str:
    """What is wrong with the data file itself, in a few words, from the error reading it raised."""
    if isinstance(error, UnicodeDecodeError):
        return f"not UTF-8 text (byte {error.start})"
    if isinstance(error, RecursionError):
        return "nested too deeply"
    try:
        if path.stat().st_size == 0:
            return "empty (0 bytes)"
    except OSError:
        pass
    detail = " ".join(str(error).split()) or type(error).__name__
    return f"not readable as {suffix_of(path) or path.suffix} ({detail})"
