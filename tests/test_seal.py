"""Seals: the key a checkpoint's manifests are sealed under is the user's own (0600) or the team's, and a
seal holds for the exact bytes and key only (checkpoints themselves: tests/test_resume.py, test_evaluate.py)."""

from __future__ import annotations

import stat

import pytest

from trainables.runtime import seal


@pytest.fixture
def key_home(tmp_path, monkeypatch):
    """A user's config folder of its own, and no team key."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv(seal.KEY_ENV, raising=False)
    return tmp_path / "config"


def test_the_key_is_the_users_own_0600_or_the_teams(key_home, monkeypatch):
    key = seal.seal_key()
    assert len(key) == 2 * seal.KEY_BYTES and seal.seal_key() == key  # created once, then read
    assert stat.S_IMODE(seal.key_file().stat().st_mode) == 0o600 and seal.key_file().is_relative_to(key_home)
    monkeypatch.setenv(seal.KEY_ENV, "a team's shared secret")
    assert seal.seal_key() == b"a team's shared secret"


def test_a_seal_holds_for_the_exact_bytes_and_key(key_home):
    key = seal.seal_key()
    assert seal.seal_of(b"state", key) == seal.seal_of(b"state", key)
    assert seal.seal_of(b"stat3", key) != seal.seal_of(b"state", key)
    assert seal.seal_of(b"state", b"another key") != seal.seal_of(b"state", key)
