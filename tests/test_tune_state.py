"""Ray Tune's pickled state is sealed while a sweep runs and only the sealed bytes are restored
(orchestrator/tune_state.py); a folder without the product's seal, or with a file changed after it, is
refused in one line naming it, unless the user says they trust it."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

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


class Payload:
    """A crafted pickle: unpickling it creates `marker` (it runs the code it names)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_a_crafted_tuner_pkl_in_an_unsealed_folder_never_runs(tmp_path):
    """`sweep --resume` on a folder this product did not seal: exit 2, one line naming the folder and the
    flag, before Ray starts; the crafted pickle's marker is never created."""
    marker, tune = tmp_path / "it-ran", tmp_path / "runs" / "ead" / "tune"
    tune.mkdir(parents=True)
    (tune / "tuner.pkl").write_bytes(pickle.dumps(Payload(marker)))
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "config"), RAY_ADDRESS="127.0.0.1:1")  # no cluster is started
    command = [
        sys.executable,
        "-m",
        "orchestrator.sweep",
        "search_spaces/ead.yaml",
        "--storage",
        str(tmp_path / "runs"),
    ]
    out = subprocess.run([*command, "--name", "ead", "--resume"], capture_output=True, text=True, env=env, timeout=300)
    errors = [line for line in out.stdout.splitlines() if line.startswith("error:")]
    assert out.returncode == 2 and len(errors) == 1, out.stdout + out.stderr
    assert str(tune) in errors[0] and "without this product's seal" in errors[0] and "--trust-unsealed" in errors[0]
    assert not marker.exists()
    assert pickle.loads((tune / "tuner.pkl").read_bytes()) is None and marker.exists()  # the payload is live
