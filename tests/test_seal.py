"""Seals: a sweep folder's pickled Tune state is restored only when this product's key sealed it as it is;
another's folder is refused in one line, unread, unless the user says they trust it."""

from __future__ import annotations

import os
import stat

import pytest

from orchestrator import experiment, sweep
from trainables.runtime import seal


class Payload:
    """What a crafted tuner.pkl would run when unpickled: it creates a marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture
def key_home(tmp_path, monkeypatch):
    """A user's config folder of its own, and no team key."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv(seal.KEY_ENV, raising=False)
    return tmp_path / "config"


def crafted_sweep(tmp_path):
    """<tmp>/runs/s: a sweep folder someone else made, its tuner.pkl a payload."""
    import pickle

    tune = tmp_path / "runs" / "s" / "tune"
    tune.mkdir(parents=True)
    (tune / "tuner.pkl").write_bytes(pickle.dumps(Payload(tmp_path / "ran")))
    (tune / "experiment_state-2026-01-01_00-00-00.json").write_text("{}")
    return tune


def test_the_key_is_the_users_own_0600_or_the_teams(key_home, monkeypatch):
    key = seal.seal_key()
    assert len(key) == 2 * seal.KEY_BYTES and seal.seal_key() == key  # created once, then read
    assert stat.S_IMODE(seal.key_file().stat().st_mode) == 0o600 and seal.key_file().is_relative_to(key_home)
    monkeypatch.setenv(seal.KEY_ENV, "a team's shared secret")
    assert seal.seal_key() == b"a team's shared secret"


def seal_folder(folder, names, key) -> None:
    seals: dict[str, list[str]] = {}
    seal.add_seals(seals, str(folder), names, key)
    seal.write_seals(str(folder), seals)


def test_a_seal_holds_for_the_exact_bytes_and_key(key_home, tmp_path):
    (tmp_path / "a.pkl").write_bytes(b"state")
    (tmp_path / "b.pkl").write_bytes(b"other")
    key = seal.seal_key()
    seal_folder(tmp_path, ["a.pkl"], key)
    assert seal.unsealed(str(tmp_path), ["a.pkl"], key) is None
    assert seal.unsealed(str(tmp_path), ["a.pkl", "b.pkl"], key)[0] == "b.pkl"  # never sealed
    assert seal.unsealed(str(tmp_path), ["a.pkl"], b"another key")[0] == "a.pkl"
    (tmp_path / "a.pkl").write_bytes(b"stat3")  # one byte changed after the seal
    assert "does not match its seal" in seal.unsealed(str(tmp_path), ["a.pkl"], key)[1]


def test_a_folder_copied_mid_write_still_verifies(key_home, tmp_path):
    """The seals of a file's last versions: a copy that has the new SEALS file beside the old state (a sync
    cut short), or the new state, is vouched for; a version older than KEEP writes is not."""
    key, seals, versions = seal.seal_key(), {}, [b"v0", b"v1", b"v2", b"v3"]
    for version in versions:
        (tmp_path / "s.json").write_bytes(version)
        seal.add_seals(seals, str(tmp_path), ["s.json"], key)
    seal.write_seals(str(tmp_path), seals)
    for version, vouched in zip(versions, [False, True, True, True]):
        (tmp_path / "s.json").write_bytes(version)
        assert (seal.unsealed(str(tmp_path), ["s.json"], key) is None) == vouched, version


def test_a_crafted_tuner_pkl_in_a_folder_this_product_did_not_seal_never_runs(key_home, tmp_path, capsys):
    """--resume on a sweep folder someone else wrote: refused in one line naming the file, before Ray starts
    and before anything is unpickled; the payload's marker is never created."""
    crafted_sweep(tmp_path)
    code = sweep.main(["search_spaces/ead.yaml", "--name", "s", "--storage", str(tmp_path / "runs"), "--resume"])
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, out
    assert "tuner.pkl has no seal" in lines[0] and "--trust-unsealed" in lines[0], lines[0]
    assert not (tmp_path / "ran").exists()


def test_a_folder_resealed_by_someone_else_is_refused(key_home, tmp_path, capsys):
    """Their SEALS file, made with their key, does not vouch for the folder under this user's key."""
    tune = crafted_sweep(tmp_path)
    seal_folder(tune, experiment.tune_state_files(str(tune)), b"their key")
    with pytest.raises(experiment.SpecError, match="tuner.pkl does not match its seal"):
        experiment.check_sealed(str(tune), trust=False)
    assert not (tmp_path / "ran").exists()


def test_trusting_says_so_at_run_time_before_anything_is_read(key_home, tmp_path, capsys):
    """With --trust-unsealed the warning comes first, and the folder's files as they are get this user's seals."""
    tune = crafted_sweep(tmp_path)
    seals = experiment.check_sealed(str(tune), trust=True)
    assert "--trust-unsealed: restoring" in capsys.readouterr().out and not (tmp_path / "ran").exists()
    assert sorted(seals) == ["experiment_state-2026-01-01_00-00-00.json", "tuner.pkl"]
    seal.write_seals(str(tune), seals)
    assert experiment.check_sealed(str(tune), trust=False) == seals


def test_every_file_tune_may_unpickle_is_sealed(key_home, tmp_path):
    """Every file at the top of Tune's folder (its states hold cloudpickled objects whatever their suffix)
    and every .pkl below; a crafted search generator state is refused like a crafted tuner.pkl."""
    tune = crafted_sweep(tmp_path)
    (tune / "trial_1").mkdir()
    (tune / "trial_1" / "error.pkl").write_bytes(b"x")
    (tune / "trial_1" / "result.json").write_text("{}")
    names = experiment.tune_state_files(str(tune))
    assert names == ["experiment_state-2026-01-01_00-00-00.json", "trial_1/error.pkl", "tuner.pkl"]
    seal_folder(tune, names, seal.seal_key())
    (tune / "search_gen_state-2026-01-01_00-00-00.json").write_text("{}")
    with pytest.raises(experiment.SpecError, match="search_gen_state-2026-01-01_00-00-00.json has no seal"):
        experiment.check_sealed(str(tune), trust=False)
    (tune / "search_gen_state-2026-01-01_00-00-00.json").unlink()
    checked = experiment.check_sealed(str(tune), trust=False)  # carried into the resumed run's seals
    assert sorted(checked) == names and not (tmp_path / "ran").exists()
