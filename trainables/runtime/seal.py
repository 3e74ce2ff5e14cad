"""Seals: how the product knows the state files it wrote itself, before it unpickles any of them.

A seal is HMAC-SHA256 over a file's exact bytes under a key only its user (or team) holds: the key named
by KEY_ENV when set (a team shares one), else a per-user key created once, 0600, at `key_file()`. A
folder's seals sit in its SEALS file as {relative path: [seal, ...]}, the newest first: the last KEEP
versions of each file, so a folder copied file by file while it is being written (a sync cut short by a
crash) still holds only files it vouches for. A file whose seal is missing or wrong was written by
someone else, or changed after the product wrote it; it is refused unread unless the user says they
trust the folder.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

import pyarrow.fs

KEY_ENV = "RLVR_EXPLORE_SEAL_KEY"
SEALS = "SEALS.json"
KEY_BYTES = 32
KEEP = 3  # versions of a file a SEALS file vouches for


def key_file() -> Path:
    """Where the per-user key lives: $XDG_CONFIG_HOME (or ~/.config)/rlvr-explore/seal.key."""
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "rlvr-explore" / "seal.key"


def seal_key() -> bytes:
    """The team's key (KEY_ENV), else this user's, created on first use with 0600 permissions."""
    if os.environ.get(KEY_ENV):
        return os.environ[KEY_ENV].encode()
    path = key_file()
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:  # O_EXCL: two processes creating it at once keep the first one's key
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(KEY_BYTES))
        except FileExistsError:
            pass
    return path.read_text().strip().encode()


def seal_of(data: bytes, key: bytes) -> str:
    """HMAC-SHA256(key, data), hex."""
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def read_bytes(fs: pyarrow.fs.FileSystem, path: str) -> bytes:
    with fs.open_input_stream(path) as f:
        return f.read()


def seals_in(uri: str) -> dict[str, list[str]]:
    """The seals recorded in the folder at `uri` ({} when it has no readable SEALS file)."""
    fs, folder = pyarrow.fs.FileSystem.from_uri(uri)
    try:
        seals = json.loads(read_bytes(fs, f"{folder}/{SEALS}"))
    except (OSError, ValueError):
        return {}
    ok = isinstance(seals, dict) and all(isinstance(k, str) and isinstance(v, list) and
                                         all(isinstance(s, str) for s in v) for k, v in seals.items())
    return seals if ok else {}


def add_seals(seals: dict[str, list[str]], folder: str, names: list[str], key: bytes) -> None:
    """Seal the files `names` of the local or remote `folder` as they are now, newest first in `seals`."""
    fs, root = pyarrow.fs.FileSystem.from_uri(folder)
    for name in names:
        seal = seal_of(read_bytes(fs, f"{root}/{name}"), key)
        seals[name] = [seal, *(s for s in seals.get(name, []) if s != seal)][:KEEP]


def write_seals(uri: str, seals: dict[str, list[str]]) -> None:
    """The folder's SEALS file, written whole (to a temporary name, then moved where the filesystem can)."""
    fs, folder = pyarrow.fs.FileSystem.from_uri(uri)
    fs.create_dir(folder, recursive=True)
    tmp = f"{folder}/.{SEALS}.tmp"
    with fs.open_output_stream(tmp) as f:
        f.write(json.dumps(seals, indent=1, sort_keys=True).encode())
    fs.move(tmp, f"{folder}/{SEALS}")


def unsealed(uri: str, names: list[str], key: bytes) -> tuple[str, str] | None:
    """(the first of `names`, in their order, in the folder at `uri` that no seal vouches for as it is
    now, why), or None when every one is sealed."""
    fs, folder = pyarrow.fs.FileSystem.from_uri(uri)
    seals = seals_in(uri)
    for name in names:
        if name not in seals:
            return name, "has no seal of this product's key"
        seal = seal_of(read_bytes(fs, f"{folder}/{name}"), key)
        if not any(hmac.compare_digest(seal, s) for s in seals[name]):
            return name, "does not match its seal (changed since it was sealed, or sealed with another key)"
    return None
