"""Inputs from outside, checked by kind before Ray starts: names, storage and cache paths, tracking
URIs, model folders and data files. Each check raises `SpecError` with one line naming the key (or
flag) and the file, and what was expected.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from urllib.parse import urlparse

from trainables.config import TrialConfig, one_path_component

TRACKING_SCHEMES = ("sqlite", "file", "http", "https", "postgresql", "mysql", "mssql", "databricks")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


class SpecError(ValueError):
    """A spec or flag that cannot run; the message is one line per problem, each naming the key."""


def check_name(name: str, where: str) -> str:
    try:
        return one_path_component(name)
    except ValueError as e:
        raise SpecError(f"{where}: {e}") from None


def check_folder_path(path: str, where: str) -> None:
    """A local folder to create or use (storage, cache): not an existing file."""
    if "://" in path:
        return
    if not path.strip():
        raise SpecError(f"{where}: empty; give a folder")
    if Path(path).expanduser().exists() and not Path(path).expanduser().is_dir():
        raise SpecError(f"{where}: {path} is a file, not a folder")


def check_tracking_uri(uri: str, where: str) -> None:
    """An MLflow tracking URI MLflow can open: sqlite:///FILE, file:///FOLDER, http(s)://HOST[:PORT], a database."""
    expected = "expected sqlite:///PATH, file:///FOLDER, http(s)://HOST[:PORT] or a database URI"
    try:
        parsed = urlparse(uri)
        port_ok = parsed.port is None or parsed.port > 0  # .port raises on a port that is not a number
    except ValueError as e:
        raise SpecError(f"{where}: {uri!r} is not a URI ({e}); {expected}") from None
    if parsed.scheme not in TRACKING_SCHEMES or not port_ok:
        raise SpecError(f"{where}: {uri!r}: {expected}")
    if parsed.scheme in ("http", "https") and not parsed.hostname:
        raise SpecError(f"{where}: {uri!r} names no host; {expected}")
    if parsed.scheme == "sqlite":
        file = Path(uri.removeprefix("sqlite:///"))
        if not uri.startswith("sqlite:///") or not file.name or file.is_dir():
            raise SpecError(f"{where}: {uri!r}: expected sqlite:///PATH to a database file")
        if file.parent.exists() and not file.parent.is_dir():
            raise SpecError(f"{where}: {uri!r}: {file.parent} is a file, not a folder")


def safetensors_problem(file: Path) -> str | None:
    """Why a .safetensors file cannot be a whole one (None: its header and size agree)."""
    size = file.stat().st_size
    with file.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return "shorter than its header"
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            return "truncated in its header"
        try:
            header = json.loads(f.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return "its header is not JSON"
    ends = [
        t["data_offsets"][1]
        for k, t in header.items()
        if k != "__metadata__"
        and isinstance(t, dict)
        and isinstance(t.get("data_offsets"), list)
        and len(t["data_offsets"]) == 2
    ]
    if not ends:
        return "no tensors"
    if 8 + length + max(ends) > size:
        return f"truncated: {size} bytes, its tensors end at {8 + length + max(ends)}"
    return None


def check_model_folder(path: str, where: str, *, tokenizer: bool = True) -> None:
    """A Hugging Face (or sentence-transformers) folder with a config, whole weights and a tokenizer."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise SpecError(
            f"{where}: {folder} is not a folder (expected a Hugging Face model folder: config.json, weights, tokenizer)"
        )
    config = folder / "config.json"
    try:
        if not isinstance(json.loads(config.read_text(encoding="utf-8")), dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        raise SpecError(f"{where}: {folder} has no config.json (not a Hugging Face model folder)") from None
    except (ValueError, OSError) as e:
        raise SpecError(f"{where}: {config} is unreadable ({e})") from None
    weights = sorted(p for pattern in WEIGHT_PATTERNS for p in folder.glob(pattern))
    if not weights:
        raise SpecError(f"{where}: {folder} has no weights ({' or '.join(WEIGHT_PATTERNS)})")
    for file in weights:
        problem = safetensors_problem(file) if file.suffix == ".safetensors" else None
        if problem or file.stat().st_size == 0:
            raise SpecError(f"{where}: {file} is not a whole weights file ({problem or 'empty'})")
    if tokenizer and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise SpecError(f"{where}: {folder} has no tokenizer ({', '.join(TOKENIZER_FILES)})")


def check_offline_files(trial: TrialConfig, source: str) -> None:
    """Each offline file reads (UTF-8, its format) and yields at least one usable row."""
    from trainables.data.offline import read_rows

    for i, spec in enumerate(trial.offline.files):
        where = f"{source}: offline.files[{i}].path"
        try:
            rows, skipped = read_rows(spec.path, spec.columns)
        except (OSError, ValueError) as e:  # missing, unknown suffix, not UTF-8, not Parquet
            raise SpecError(f"{where}: {spec.path}: {e}") from None
        if not rows:
            raise SpecError(f"{where}: {spec.path} yields no usable row (skipped: {dict(skipped) or 'empty file'})")


def check_trial_inputs(trial: TrialConfig, source: str) -> None:
    """Every outside input of a trial spec: paths, URI, the model and encoder folders, the data files."""
    check_folder_path(trial.storage, f"{source}: storage")
    check_folder_path(trial.cache_dir, f"{source}: cache_dir")
    if trial.logging.tracking_uri:
        check_tracking_uri(trial.logging.tracking_uri, f"{source}: logging.tracking_uri")
    if trial.model.path:
        check_model_folder(trial.model.path, f"{source}: model.path")
    if trial.encoder.model and trial.preset.needs_embeddings:
        check_model_folder(trial.encoder.model, f"{source}: encoder.model", tokenizer=False)
    check_offline_files(trial, source)
