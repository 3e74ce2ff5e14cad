"""One command per run name and storage: a live lease refuses a second command in one line; a lease
whose holder died, or that expired, is taken over."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from orchestrator import experiment, launch, sweep, train
from orchestrator.lease import LEASE_FILE, Lease
from orchestrator.spec import SpecError

HOLD = (
    "import sys, time\nfrom orchestrator.lease import Lease\nLease(sys.argv[1]).acquire('x')\n"
    "print('held', flush=True)\ntime.sleep(120)\n"
)
TRY = (
    "import sys\nfrom orchestrator.lease import Lease\nfrom orchestrator.spec import SpecError\n"
    "try:\n    Lease(sys.argv[1]).acquire('x')\n    print('held', flush=True)\n"
    "except SpecError:\n    print('refused', flush=True)\nimport time; time.sleep(3)\n"
)


@pytest.fixture
def holder(tmp_path):
    """Another process holding the lease of <tmp>/ead (a sweep named ead in storage tmp_path)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "ead")], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield proc
    proc.kill()
    proc.wait()


def test_a_second_command_of_the_same_name_is_refused(holder, tmp_path, capsys, monkeypatch):
    def started(*args, **kwargs):
        raise AssertionError("the second command went on")

    monkeypatch.setattr(experiment, "start_cluster", started)
    monkeypatch.setattr(launch, "start_cluster", started)
    monkeypatch.setattr(launch, "fit_trial", started)
    for main, args in (
        (sweep.main, ["search_spaces/ead.yaml", "--storage", str(tmp_path)]),
        (train.main, ["search_spaces/ead.yaml", "--set", f"storage={tmp_path}", "--set", "name=ead", "--resume"]),
        (train.main, ["search_spaces/ead.yaml", "--set", f"storage={tmp_path}", "--set", "name=ead"]),
    ):
        assert main(args) == 2
        lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
        assert len(lines) == 1 and "is running" in lines[0] and f"pid {holder.pid}" in lines[0], lines


def test_a_dead_holders_lease_is_taken_over_at_once(holder, tmp_path):
    holder.kill()
    holder.wait()
    lease = Lease(str(tmp_path / "ead"))
    lease.acquire("x")  # the holder's lease has 60 s left, but its process is gone
    assert json.loads((tmp_path / "ead" / LEASE_FILE).read_text())["pid"] != holder.pid
    lease.release()
    assert not (tmp_path / "ead" / LEASE_FILE).exists()


@pytest.mark.parametrize("expires_in, refused", [(30.0, True), (-1.0, False)])
def test_another_machines_lease_counts_until_it_expires(tmp_path, expires_in, refused):
    (tmp_path / LEASE_FILE).write_text(
        json.dumps({"owner": "o", "host": "elsewhere", "pid": 1, "expires": time.time() + expires_in})
    )
    lease = Lease(str(tmp_path))
    if refused:
        with pytest.raises(SpecError, match="is running \\(elsewhere, pid 1"):
            lease.acquire("x")
    else:
        lease.acquire("x")
        lease.release()


def test_two_commands_started_together_one_holds(tmp_path):
    procs = [
        subprocess.Popen([sys.executable, "-c", TRY, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outcomes = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert outcomes == ["held", "refused"]


def test_resume_with_other_settings_is_refused_naming_them(tmp_path):
    from orchestrator.lease import check_settings

    first = {"trial": {"learner": {"lr": 1e-4, "steps": 30}, "seed": 0}, "search": {"seeds": 3}}
    check_settings(str(tmp_path), first, resume=False, force=False)
    check_settings(str(tmp_path), first, resume=True, force=False)  # the same spec resumes
    changed = {"trial": {"learner": {"lr": 3e-4, "steps": 30}, "seed": 0}, "search": {"seeds": 3, "seed": 1}}
    with pytest.raises(SpecError) as info:
        check_settings(str(tmp_path), changed, resume=True, force=False)
    message = str(info.value)
    assert len(message.splitlines()) == 1 and "2 field(s)" in message
    assert "trial.learner.lr (0.0001 -> 0.0003)" in message and "search.seed (None -> 1)" in message
    check_settings(str(tmp_path), changed, resume=True, force=True)  # forced: the new settings are the run's now
    check_settings(str(tmp_path), changed, resume=True, force=False)


@pytest.mark.parametrize("as_uri", [False, True])
def test_an_existing_run_is_refused_without_resume_in_a_folder_and_under_a_uri(tmp_path, as_uri):
    from orchestrator.spec import load_trial_spec
    from orchestrator.train import check_fresh

    storage = f"file://{tmp_path}" if as_uri else str(tmp_path)
    cfg = load_trial_spec(
        "search_spaces/ead.yaml", [f"storage={storage}", f"logging.tracking_uri=sqlite:///{tmp_path}/mlflow.db"]
    )
    check_fresh(cfg, resume=False)  # nothing there yet
    (tmp_path / cfg.name).mkdir()
    with pytest.raises(SpecError, match="already exists"):
        check_fresh(cfg, resume=False)
    check_fresh(cfg, resume=True)


@pytest.mark.parametrize("text", ["{broken", "[1, 2]", "[" * 50_000 + "]" * 50_000])
def test_a_settings_file_that_is_not_settings_is_one_line_and_left_alone(tmp_path, text):
    from orchestrator.lease import SETTINGS_FILE, check_settings

    (tmp_path / SETTINGS_FILE).write_text(text)
    with pytest.raises(SpecError, match=SETTINGS_FILE) as info:
        check_settings(str(tmp_path), {"trial": {}}, resume=True, force=False)
    assert len(str(info.value).splitlines()) == 1 and (tmp_path / SETTINGS_FILE).read_text() == text


def test_tune_state_another_user_wrote_is_not_restored(tmp_path, capsys):
    """Tune's state is pickled: a resume reads only state its own user wrote; under a URI it says what it unpickles."""
    import os

    from orchestrator.experiment import check_state_owner

    tune = tmp_path / "tune"
    tune.mkdir()
    (tune / "tuner.pkl").write_bytes(b"\x80\x04N.")
    check_state_owner(str(tune))  # written by this user
    with pytest.raises(SpecError) as info:
        check_state_owner(str(tune), uid=os.getuid() + 1)  # as another user sees the same folder
    assert str(tune) in str(info.value) and "tuner.pkl" in str(info.value)
    check_state_owner("s3://bucket/sweeps/ead/tune")
    assert "s3://bucket/sweeps/ead/tune" in capsys.readouterr().out
