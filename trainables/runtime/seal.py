"""Seals: how the product knows the checkpoints it wrote itself, before it reads any of them.

A seal is HMAC-SHA256 over exact bytes under a key only its user (or team) holds: the key named by
KEY_ENV when set (a team shares one), else a per-user key created once, 0600, at `key_file()`. A
checkpoint's manifests carry it (trainables/runtime/checkpoint.py); one whose seal is missing or wrong
was written by someone else, or changed after the product wrote it, and is refused unless the user
says they trust it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

KEY_ENV = "RLVR_EXPLORE_SEAL_KEY"
KEY_BYTES = 32


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
