"""Ray Tune's pickled state is sealed while a sweep runs and only the sealed bytes are restored
(orchestrator/tune_state.py); a folder without the product's seal, or with a file changed after it, is
refused in one line naming it, unless the user says they trust it."""

from __future__ import annotations

import time

import pytest

from orchestrator import tune_state
from orchestrator.spec import SpecError
from trainables.runtime.seal import KEY_ENV

STATE = {"tuner.pkl": b"tuner", "experiment_state-a.json": b'{"trial_data": []}', "searcher-state-a.pkl": b"s"}


@pytest.fixture
def tune(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "a team's key")
    folder = tmp_path / "sweep" / "tune"
    folder.mkdir(parents=True)
    for name, data in STATE.items():
        (folder / name).write_bytes(data)
    (folder / "trainable_1").mkdir()  # a trial's folder: not state a restore unpickles
    return folder


def test_a_resume_restores_the_sealed_bytes_and_drops_a_later_save(tune, capsys):
    assert tune_state.seal_copy(tune, b"a team's key")
    copy = tune_state.verified_copy(tune, trust=False)
    (tune / "experiment_state-a.json").write_bytes(b'{"trial_data": ["later"]}')  # saved after the copy
    (tune / "experiment_state-b.json").write_bytes(b"{}")  # a later session's first save
    tune_state.put_back(tune, copy)
    assert {p.name: p.read_bytes() for p in tune_state.state_files(tune)} == STATE
    assert "experiment_state-a.json, experiment_state-b.json" in capsys.readouterr().out


def test_unsealed_or_changed_state_is_refused_in_one_line_unless_trusted(tune, monkeypatch, capsys):
    with pytest.raises(SpecError, match="without this product's seal.*--trust-unsealed"):
        tune_state.verified_copy(tune, trust=False)  # a folder from before seals, or someone else's
    assert tune_state.verified_copy(tune, trust=True) is None
    assert "runs the code it names" in capsys.readouterr().out
    tune_state.seal_copy(tune, b"a team's key")
    monkeypatch.setenv(KEY_ENV, "another key")
    with pytest.raises(SpecError, match="experiment_state-a.json does not carry this product.s seal"):
        tune_state.verified_copy(tune, trust=False)
    monkeypatch.setenv(KEY_ENV, "a team's key")
    copy = tune_state.verified_copy(tune, trust=False)
    (copy / "searcher-state-a.pkl").write_bytes(b"someone's payload")
    with pytest.raises(SpecError, match=r"searcher-state-a.pkl does not carry") as refused:
        tune_state.verified_copy(tune, trust=False)
    assert "\n" not in str(refused.value)


def test_the_sealer_keeps_the_copy_current_and_takes_the_last_save(tune, monkeypatch):
    monkeypatch.setattr(tune_state, "POLL_S", 0.05)
    sealer = tune_state.Sealer(tune).start()
    deadline = time.monotonic() + 10
    while not (tune.parent / tune_state.SEALED / tune_state.CURRENT).is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    (tune / "experiment_state-a.json").write_bytes(b'{"trial_data": ["final"]}')  # Tune's last save
    sealer.close()
    copy = tune_state.verified_copy(tune, trust=False)
    assert (copy / "experiment_state-a.json").read_bytes() == b'{"trial_data": ["final"]}'
    assert [p.name for p in (tune.parent / tune_state.SEALED).iterdir() if p.is_dir()] == [copy.name]  # one copy
