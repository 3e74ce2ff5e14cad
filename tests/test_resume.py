"""Preemption: checkpoints a resume can trust, and faults injected into real runs on the local Ray
cluster (a learner worker, the rollout service, the trial driver, the sweep driver killed).

Every faulted run must end with the metric history of the uninterrupted run of the same seed, step
for step and bit for bit (CPU), in one MLflow run, having redone at most the steps since its last
checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest
import torch
from faults import (
    EVERY,
    TRIAL,
    check_confirmation_records,
    committed,
    driver_env,
    fault_metrics,
    finished_runs,
    history,
    logged_step,
    logged_steps,
    reference_history,
    runs,
    sigkill_actor,
    sweep_spec,
    trial_cfg,
    when,
    when_step,
)

from orchestrator import train
from orchestrator.launch import init_ray
from orchestrator.preempt import STOPPED_EXIT_CODE
from trainables.runtime.checkpoint import (
    checkpoint_problem,
    manifest_file,
    read_rank_state,
    rng_state,
    saved_world_size,
    write_manifest,
)
from trainables.runtime.seal import seal_key


@pytest.fixture(scope="module")
def reference(ray_cluster, tiny_model_path, tmp_path_factory) -> dict:
    return reference_history(tmp_path_factory)


def test_manifest_finds_missing_truncated_and_altered_parts(tmp_path):
    for rank in (0, 1):
        part = tmp_path / f"part{rank}"
        (part / "engine").mkdir(parents=True)
        (part / "engine" / f"optim_{rank}.pt").write_bytes(os.urandom(4096))
        (part / f"rank_{rank}.pt").write_bytes(b"state")
        write_manifest(part, rank, 2)
    merged = tmp_path / "merged"
    for rank in (0, 1):  # what Ray Train does with the ranks' folders
        subprocess.run(["cp", "-r", f"{tmp_path / f'part{rank}'}/.", str(merged)], check=True)
    key = seal_key()
    assert checkpoint_problem(merged, 2, key) is None and saved_world_size(merged) == 2
    assert "rank 2 never finished" in checkpoint_problem(merged, 3, key)

    optim = merged / "engine" / "optim_1.pt"
    data = optim.read_bytes()
    optim.write_bytes(data[:100])
    assert "engine/optim_1.pt has 100 bytes, its manifest says 4096" in checkpoint_problem(merged, 2, key)
    optim.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert "does not match its sha256" in checkpoint_problem(merged, 2, key)
    optim.write_bytes(data)
    (merged / manifest_file(0)).unlink()
    assert "MANIFEST.rank_0.json is missing" in checkpoint_problem(merged, 2, key)


def test_a_checkpoint_this_product_did_not_seal_is_refused_unless_trusted(tmp_path):
    """A manifest's seal vouches for its rank's part: someone else's manifest (no seal, or another key's)
    makes the checkpoint unusable, naming the file and the flag; trusted (key None), it is read as before."""
    (tmp_path / "rank_0.pt").write_bytes(b"state")
    write_manifest(tmp_path, 0, 1, key=b"someone else's key")
    assert "MANIFEST.rank_0.json does not match its seal" in checkpoint_problem(tmp_path, 1, seal_key())
    assert "--trust-unsealed" in checkpoint_problem(tmp_path, 1, seal_key())
    assert checkpoint_problem(tmp_path, 1, None) is None
    manifest = json.loads((tmp_path / manifest_file(0)).read_text())
    del manifest["seal"]  # as written before seals
    (tmp_path / manifest_file(0)).write_text(json.dumps(manifest))
    assert "MANIFEST.rank_0.json has no seal" in checkpoint_problem(tmp_path, 1, seal_key())
    write_manifest(tmp_path, 0, 1)
    assert checkpoint_problem(tmp_path, 1, seal_key()) is None


def test_foreign_checkpoint_files_are_data(tmp_path):
    """A rank file holding a pickled object is refused unread; a manifest naming a file outside its folder
    makes the checkpoint unusable."""
    torch.save({"step": 3, "rng": argparse.Namespace(seed=1)}, tmp_path / "rank_0.pt")  # any class but plain data
    with pytest.raises(ValueError, match="rank_0.pt holds objects other than tensors and plain data"):
        read_rank_state(tmp_path, 0)
    torch.save({"step": 3, "rng": rng_state()}, tmp_path / "rank_0.pt")  # what a trial writes reads back
    assert read_rank_state(tmp_path, 0)["step"] == 3
    (tmp_path.parent / "outside.txt").write_text("x")
    (tmp_path / manifest_file(0)).write_text(
        json.dumps({"rank": 0, "world_size": 1, "files": {"../outside.txt": {"size": 1, "sha256": "0" * 64}}})
    )
    assert "outside the checkpoint's folder" in checkpoint_problem(tmp_path, 1, None)


@pytest.mark.slow
def test_rollout_service_then_learner_worker_killed_mid_trial(reference, tmp_path):
    from ray.util.state import list_actors

    def faults():
        sigkill_actor("RolloutService")  # after step 1: recovered in place, nothing redone
        when_step(tmp_path, 3, lambda: sigkill_actor("RayTrainWorker")).join()  # after step 3: a restart

    watcher = when(lambda: logged_step(tmp_path) >= 1, faults)
    final = train.run(trial_cfg(tmp_path))
    watcher.join()
    assert final["progress/step"] == 5
    assert history(tmp_path) == reference
    restarted = list_actors(filters=[("class_name", "=", "RolloutService")], detail=True)
    assert any(a.num_restarts >= 1 for a in restarted)
    recorded = fault_metrics(tmp_path)
    # No service_losses assertion: a kill between a step's rollouts and its weight push costs nothing
    # (the push reaches the restarted actor) and is rightly not counted.
    # One resume, from the learner's loss alone; it redid at most the steps since the last checkpoint.
    assert len(recorded["faults/resumed_from_step"]) == 1 and max(recorded["faults/redone_steps"]) <= EVERY


@pytest.mark.faults
@pytest.mark.slow
def test_a_hung_engine_is_restarted_and_the_trial_goes_on(reference, tmp_path):
    """SIGSTOP: the engine's process lives but never answers. Past checkpoint.actor_timeout_s the trial
    restarts it, re-syncs its weights and asks again; nothing else changes."""
    when(lambda: logged_step(tmp_path) >= 2, lambda: sigkill_actor("RolloutService", signal.SIGSTOP))
    final = train.run(trial_cfg(tmp_path, "checkpoint.actor_timeout_s=10"))
    assert final["progress/step"] == 5
    assert history(tmp_path) == reference
    assert max(fault_metrics(tmp_path)["faults/service_losses"]) >= 1


@pytest.mark.slow
def test_two_engines_fed_over_gloo_reproduce_the_one_engine_history(reference, tmp_path):
    from ray.util.state import list_actors, list_tasks

    def engines():
        return {a.actor_id: a for a in list_actors(filters=[("class_name", "=", "RolloutService")], detail=True)}

    def served(method: str) -> set[str]:
        return {
            t.actor_id
            for t in list_tasks(
                filters=[("func_or_class_name", "=", f"RolloutService.{method}")], detail=True, limit=10_000
            )
        }

    before = engines()
    train.run(
        trial_cfg(tmp_path, "rollout.num_engines=2", "rollout.weight_transfer=gloo", "rollout.weight_bucket_mb=1")
    )
    new = {key for key in engines() if key not in before}
    # Each rank generated on its own engine with its own seed, at weights that came by broadcast (in
    # several buckets) instead of the object store: the results are the one-engine run's, bit for bit.
    assert history(tmp_path) == reference
    groups = {engines()[key].placement_group_id for key in new}
    assert len(new) == 2 and len(groups) == 1 and None not in groups
    assert new <= served("generate") and new <= served("receive_weights")  # both generated, both received


@pytest.mark.faults
@pytest.mark.slow
def test_overlap_trains_one_step_behind_and_resumes_exactly(reference, tmp_path):
    """rollout.overlap 1: every step after the first trains on a batch generated before the previous
    update. A learner rank killed after step 3 resumes from a checkpoint that kept the batch then in
    flight, and the trial ends with the uninterrupted overlapped run's history bit for bit."""
    uninterrupted, faulted = tmp_path / "uninterrupted", tmp_path / "faulted"
    train.run(trial_cfg(uninterrupted, "rollout.overlap=1"))
    ahead = history(uninterrupted)
    assert [lag for _, lag in ahead["rollout/policy_lag"]] == [0.0, 1.0, 1.0, 1.0, 1.0]  # one update a step
    assert [lag for _, lag in reference["rollout/policy_lag"]] == [0.0] * 5
    assert ahead["policy/grad_norm"][0] == reference["policy/grad_norm"][0]  # the first step is the synchronous one
    assert ahead["policy/grad_norm"][1:] != reference["policy/grad_norm"][1:]

    watcher = when_step(faulted, 3, lambda: sigkill_actor("RayTrainWorker"))
    train.run(trial_cfg(faulted, "rollout.overlap=1"))
    watcher.join()
    assert history(faulted) == ahead
    recorded = fault_metrics(faulted)
    assert len(recorded["faults/resumed_from_step"]) == 1 and max(recorded["faults/redone_steps"]) <= EVERY


@pytest.mark.slow
def test_deadline_stops_at_a_step_boundary_with_a_checkpoint(ray_cluster, tiny_model_path, tmp_path):
    """A deadline that has come by the first step boundary: the trial checkpoints there and stops. (The
    edge refuses a deadline already past; this one passes while the trial starts, as a real one can.)"""
    from datetime import datetime

    cfg = trial_cfg(tmp_path)
    cfg.checkpoint.save_by = datetime(2000, 1, 1)  # long past by the time the trial looks at it
    final = train.run(cfg)
    assert final["progress/preempted"] == 1 and final["progress/step"] == 1  # the first boundary
    assert committed(tmp_path) == [1]
    (run,) = runs(tmp_path)
    assert run.data.tags["state"] == "stopped"


@pytest.mark.faults
@pytest.mark.slow
def test_sigterm_checkpoints_then_resume_survives_a_torn_checkpoint(reference, ray_cluster, tmp_path, capfd):
    command = [
        sys.executable,
        "-m",
        "orchestrator.train",
        "search_spaces/ead.yaml",
        "--set",
        f"storage={tmp_path}",
        *[arg for o in TRIAL for arg in ("--set", o)],
    ]
    driver = subprocess.Popen(
        command, env=driver_env(ray_cluster), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    # The signal as soon as step 3 is logged, not also after the step-2 checkpoint's commit (Ray Train's next
    # poll, up to ~2 s): the trial's own stop commits it before the driver exits, as the fallback below needs.
    when(lambda: logged_step(tmp_path) >= 3, lambda: driver.send_signal(signal.SIGTERM))
    out, _ = driver.communicate(timeout=600)
    assert driver.returncode == STOPPED_EXIT_CODE, out[-3000:]
    assert "with --resume to continue" in out
    stopped_at = logged_step(tmp_path)
    assert 3 <= stopped_at < 5
    (run,) = runs(tmp_path)
    assert run.data.tags["state"] == "stopped"

    # The stop's checkpoint is then torn (its optimizer state cut short, as by a preempted upload):
    # the resume says so and falls back to the checkpoint of step 2.
    checkpoints = sorted(p for p in (tmp_path / "ead").glob("checkpoint_*") if p.is_dir())
    assert len(checkpoints) == 2
    latest_optimizer = max((checkpoints[-1] / "engine").rglob("*optim_states.pt"))
    latest_optimizer.write_bytes(latest_optimizer.read_bytes()[:1000])

    train.run(trial_cfg(tmp_path), resume=True)
    assert f"checkpoint {checkpoints[-1]} is unusable" in capfd.readouterr().out
    assert history(tmp_path) == reference
    faults = fault_metrics(tmp_path)
    assert faults["faults/resumed_from_step"] == [2] and faults["faults/redone_steps"] == [stopped_at - 2]
    (run,) = runs(tmp_path)
    assert run.data.tags["state"] == "finished" and run.data.tags["resumes"] == "1"


@pytest.mark.faults
@pytest.mark.slow
def test_sweep_driver_killed_or_stopped_then_resumed(reference, ray_cluster, tmp_path):
    spec = sweep_spec(tmp_path)
    command = [
        sys.executable,
        "-m",
        "orchestrator.sweep",
        str(spec),
        "--name",
        "s",
        "--storage",
        str(tmp_path),
        *[arg for o in TRIAL for arg in ("--set", o)],
    ]
    driver = subprocess.Popen(
        command, env=driver_env(ray_cluster), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    # The second trial (the reference's settings) is past its first checkpoint: kill the driver.
    when(
        lambda: logged_steps(tmp_path)[1:2] >= [3] and committed(tmp_path)[1:2] >= [1],
        lambda: driver.send_signal(signal.SIGKILL),
    )
    out, _ = driver.communicate(timeout=900)
    assert driver.returncode == -signal.SIGKILL, out[-3000:]
    assert logged_steps(tmp_path)[0] == 5 and 3 <= logged_steps(tmp_path)[1] < 5
    plain_log(out)

    # Resumed; then SIGTERM (the spot notice) while the third trial runs: it checkpoints, the driver
    # exits with 75, and a second resume finishes the sweep.
    driver = subprocess.Popen(
        [*command, "--resume"], env=driver_env(ray_cluster), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    when(lambda: logged_steps(tmp_path)[2:3] >= [2], lambda: driver.send_signal(signal.SIGTERM))
    out, _ = driver.communicate(timeout=900)
    assert driver.returncode == STOPPED_EXIT_CODE, out[-3000:]
    assert "1 trials checkpointed" in out
    resumed = subprocess.run(
        [*command, "--resume"], env=driver_env(ray_cluster), capture_output=True, text=True, timeout=900
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    plain_log(out + resumed.stdout + resumed.stderr)
    assert "report: " in resumed.stdout and (tmp_path / "s" / "report" / "report.html").is_file()

    # One MLflow run per trial and for the sweep; every trial finished, each step logged once.
    (parent,) = runs(tmp_path, "sweep")
    trials = {r.data.params["rollout.decoding.ead.tau_max"]: r for r in runs(tmp_path)}
    assert len(trials) == 3 and parent.data.tags["state"] == "finished"
    for run in trials.values():
        assert run.data.tags["state"] == "finished"
        assert [s for s, _ in history(tmp_path, run)["progress/step"]] == [1, 2, 3, 4, 5]
    killed = trials["1.2"]
    assert history(tmp_path, killed) == reference
    faults = fault_metrics(tmp_path, killed)
    assert faults["faults/resumed_from_step"] and max(faults["faults/redone_steps"]) <= EVERY
    (stopped,) = [run for tau, run in trials.items() if tau not in ("1.0", "1.2")]
    assert fault_metrics(tmp_path, stopped)["faults/redone_steps"] == [0]

    # The Optuna study went on: three trials, the restored searcher's own third proposal, no
    # point_to_evaluate proposed twice.
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's' / 'optuna.db'}")
    assert [t.number for t in study.trials] == [0, 1, 2]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    proposed = [t.params["rollout.decoding.ead.tau_max"] for t in study.trials]
    assert proposed[:2] == [1.0, 1.2] and proposed[2] not in (1.0, 1.2)


def plain_log(out: str) -> None:
    """A sweep's output sent to a file or pipe, as `docker logs` keeps it: no carriage-return updates, no
    colour codes, no line a reader cannot take in."""
    noisy = [line for line in out.split("\n") if "\r" in line or "\x1b" in line]
    assert not noisy, [repr(line[:300]) for line in noisy[:5]]
    assert max(map(len, out.splitlines())) <= 400, max(out.splitlines(), key=len)


def kill_session(driver: subprocess.Popen) -> None:
    """A spot VM vanishing: the driver and its local Ray cluster (every process of its session) die at once."""
    while pids := subprocess.run(["pgrep", "-s", str(driver.pid)], capture_output=True, text=True).stdout.split():
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        driver.poll()  # reaps the driver, whose zombie pgrep would list forever
        time.sleep(0.5)


# Moments of a sweep's life, each found from its own progress (MLflow steps, Ray Train's committed
# checkpoints, the files the sweep writes).
KILL_POINTS = {
    # the first configuration's last step checkpointed and committed, before Tune records the trial's end
    "first_trial_after_its_last_step": lambda storage: finished_runs(storage, 5) >= 1,
    # between configurations: the second one's MLflow run open, its start-up under way, no step yet
    "between_configurations": lambda storage: len(logged_steps(storage)) >= 2 and logged_steps(storage)[1] == 0,
    # the second configuration mid-trial, past its first checkpoint
    "second_trial_mid_run": lambda storage: logged_steps(storage)[1:2] >= [3] and committed(storage)[1:2] >= [1],
    # a confirmation seed past its first checkpoint (the selection over, the verdict not yet made)
    "mid_confirmation": lambda storage: max(logged_steps(storage, "confirm"), default=0) >= 3,
    # the report being written: its folder made, the parent run already closed with the verdict
    "while_reporting": lambda storage: (storage / "s" / "report").is_dir(),
}
# A preemptible sweep may be lost more than once: each case kills the whole machine at its points in turn,
# in the order a sweep reaches them, resuming after each; every store is checked after the last resume.
# The first case runs the reference's trial under ASHA (which may stop the second configuration at step
# 4); the second a lighter trial (one rank, 8 prompts) without a scheduler, so that both run to the end
# and the confirmation runs.
CASES = {
    ("first_trial_after_its_last_step", "second_trial_mid_run"): "asha",
    ("between_configurations", "mid_confirmation", "while_reporting"): "confirm",
}
SETTINGS = {
    "asha": ["search.scheduler={name: asha, grace_period: 4}", *TRIAL],
    "confirm": [
        "search.confirm={seeds: 2, max_seeds: 2}",
        "learner.steps=5",
        f"checkpoint.every={EVERY}",
        "validation.every=2",
        "validation.num_prompts=8",
        "validation.samples=2",
    ],
}


@pytest.mark.faults
@pytest.mark.slow
@pytest.mark.parametrize("kill_points", list(CASES), ids="+".join)
def test_whole_machine_lost_then_resumed_keeps_true_records(reference, ray_cluster, tmp_path, kill_points):
    """The sweep's driver runs its own local Ray cluster; at each of `kill_points` the whole machine goes
    (driver, GCS, raylet, workers) and the same command with --resume on a fresh cluster goes on. MLflow,
    Tune and Optuna each say what happened to every trial, and the verdict is the seeds' own."""
    ray_cluster.shutdown()  # this machine runs one cluster at a time: the sweep's own
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    command = [
        sys.executable,
        "-m",
        "orchestrator.sweep",
        str(sweep_spec(tmp_path)),
        "--name",
        "s",
        "--storage",
        str(tmp_path),
        "--num-samples",
        "2",
        *[arg for o in SETTINGS[CASES[kill_points]] for arg in ("--set", o)],
    ]
    try:
        for point, resume in zip(kill_points, ([], *[["--resume"]] * len(kill_points))):
            driver = subprocess.Popen(
                [*command, *resume],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            when(lambda: KILL_POINTS[point](tmp_path), lambda: kill_session(driver)).join()
            driver.wait(timeout=60)
            assert driver.returncode == -signal.SIGKILL, (point, driver.returncode)  # killed, not finished
        resumed = subprocess.run([*command, "--resume"], env=env, capture_output=True, text=True, timeout=900)
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    finally:
        init_ray(num_cpus=6)  # the suite's cluster again
    if CASES[kill_points] == "asha":
        check_selection_records(tmp_path, reference)
    else:
        check_selection_records(tmp_path, None)
        check_confirmation_records(tmp_path, resumed.stdout)


def check_selection_records(storage, reference: dict | None) -> None:
    """Each store says what happened to each selection trial, and they agree: ASHA may stop one at step 4
    (pruned everywhere) or let it run to step 5 (finished everywhere, each step once; the reference's
    settings with the uninterrupted history)."""
    from ray import tune

    def trainable(config):  # Tune checks the name only: reading results runs nothing
        raise AssertionError("not run")

    grid = tune.Tuner.restore(str(storage / "s" / "tune"), trainable).get_results()
    final = {r.config["rollout.decoding.ead.tau_max"]: r.metrics for r in grid}
    assert sorted(final) == [1.0, 1.2] and all(m["progress/step"] >= 4 for m in final.values())
    (parent,) = runs(storage, "sweep")
    assert parent.data.tags["state"] == "finished" and parent.info.status == "FINISHED"
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{storage / 's' / 'optuna.db'}")
    proposals = [t for t in study.trials if "lost" not in t.user_attrs]  # never started: FAIL, and said so
    assert len(proposals) == 2 and all(
        t.state == optuna.trial.TrialState.FAIL for t in study.trials if "lost" in t.user_attrs
    )
    optuna_state = {t.params["rollout.decoding.ead.tau_max"]: t.state for t in proposals}
    selection = [r for r in runs(storage) if r.data.tags["stage"] == "select"]
    assert sorted(float(r.data.params["rollout.decoding.ead.tau_max"]) for r in selection) == [1.0, 1.2]
    for run in selection:
        tau = float(run.data.params["rollout.decoding.ead.tau_max"])
        steps = [s for s, _ in history(storage, run)["progress/step"]]
        finished = max(steps) == 5  # the truth: its own steps
        assert (final[tau]["progress/step"] == 5) == finished, (tau, final[tau].get("progress/step"))
        assert (run.data.tags["state"], run.info.status) == ("finished" if finished else "pruned", "FINISHED")
        assert optuna_state[tau] == (optuna.trial.TrialState.COMPLETE if finished else optuna.trial.TrialState.PRUNED)
        assert steps == list(range(1, len(steps) + 1)) and len(steps) >= final[tau]["progress/step"]
        if reference is not None and tau == 1.2 and finished:  # the reference's settings and seed
            assert history(storage, run) == reference
    # The scheduler's durable records name exactly the configurations every store calls pruned.
    recorded = {p.stem for p in (storage / "s" / "pruned").glob("*.json")}
    assert recorded == {r.data.tags["config"] for r in selection if r.data.tags["state"] == "pruned"}
    assert {
        t.params["rollout.decoding.ead.tau_max"]: t.value
        for t in proposals
        if t.state == optuna.trial.TrialState.COMPLETE
    } == {tau: m["val/accuracy"] for tau, m in final.items() if m["progress/step"] == 5}


def test_a_full_disk_during_a_checkpoint_is_said_in_one_line(tmp_path):
    """torch.save past a file-size limit fails as a full disk does; that failure, however torch words it,
    becomes one line naming the step, the folder and the space left. Other errors are not disguised."""
    from trainables.runtime.errors import write_failure

    code = (
        "import resource, signal, torch\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\ntry:\n"
        "    torch.save(torch.zeros(100_000), 'rank_0.pt')\nexcept Exception as e:\n"
        "    print(type(e).__name__, '|', e)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True).stdout
    kind, message = out.split(" | ", 1)
    error = OSError(message) if kind in ("OSError", "PermissionError") else RuntimeError(message)
    assert kind in ("RuntimeError", "OSError")
    failure = write_failure(error, str(tmp_path), 2)
    assert str(failure).startswith(f"checkpoint: cannot write step 3 in {tmp_path} (") and "MiB free" in str(failure)
    assert "\n" not in str(failure)
    assert write_failure(RuntimeError("NCCL communicator was aborted"), str(tmp_path), 2) is None


def test_a_trials_own_error_is_found_in_what_ray_train_raises():
    from ray.train import WorkerGroupError
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback

    from trainables.runtime.errors import NonFiniteError, stated

    cause = NonFiniteError("trial t: step 4: policy/grad_norm not finite")
    wrapped = WorkerGroupError("worker failed", {1: UserExceptionWithTraceback(cause, "Traceback ...")})
    assert stated(wrapped) is cause
    assert stated(WorkerGroupError("worker failed", {0: ValueError("a bug")})) is None


def test_a_non_finite_step_stops_the_trial_naming_it():
    from trainables.runtime.errors import NonFiniteError
    from trainables.step_metrics import WATCHED, check_finite

    step_1 = {"progress/step": 1.0, **dict.fromkeys(WATCHED, 0.5)}
    last = check_finite(step_1, {}, "trial t: step 1")
    assert last == {"progress/step": 1.0, **dict.fromkeys(WATCHED, 0.5)}
    for broken in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(NonFiniteError) as stop:
            check_finite({**step_1, "progress/step": 2.0, "policy/grad_norm": broken}, last, "trial t: step 2")
        line = str(stop.value)
        assert line.startswith("trial t: step 2: policy/grad_norm not finite") and "'policy/grad_norm': 0.5" in line
        assert "\n" not in line


@pytest.mark.faults
@pytest.mark.slow
def test_a_resume_from_checkpoints_sealed_elsewhere_is_refused_in_one_line(
    ray_cluster, tiny_model_path, tmp_path, capsys
):
    """Every checkpoint of a stopped trial re-sealed under another key (as a colleague's folder would be):
    `train --resume` exits 2 with one line naming the manifest and the flag; with --trust-unsealed it
    continues to the end."""
    from datetime import datetime

    from trainables.runtime.checkpoint import Manifest, read_record

    sets = [
        arg for o in [f"storage={tmp_path}", *TRIAL, "learner.steps=3", "checkpoint.every=1"] for arg in ("--set", o)
    ]
    cfg = trial_cfg(tmp_path, "learner.steps=3", "checkpoint.every=1")
    cfg.checkpoint.save_by = datetime(2000, 1, 1)  # stops with a checkpoint at the first step boundary
    assert train.run(cfg)["progress/preempted"] == 1
    for manifest in (tmp_path / "ead").glob("checkpoint_*/MANIFEST.rank_*.json"):
        record = read_record(manifest, Manifest)
        write_manifest(manifest.parent, record.rank, record.world_size, key=b"their key")
    capsys.readouterr()
    assert train.main(["search_spaces/ead.yaml", *sets, "--resume", "--force"]) == 2  # --force: save_by differs
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("trial stopped:")]
    assert len(lines) == 1 and "does not match its seal" in lines[0] and "--trust-unsealed" in lines[0], lines
    assert train.main(["search_spaces/ead.yaml", *sets, "--resume", "--force", "--trust-unsealed"]) == 0
    (run,) = runs(tmp_path)
    assert run.data.tags["state"] == "finished" and run.data.metrics["progress/step"] == 3
