"""A multi-node Ray cluster on one machine (`ray.cluster_utils.Cluster`: a head and a worker raylet), used
the way spot GPU nodes are: the worker node drained with a preemption notice, SIGTERM to a learner's
process, the worker node taken away at each moment of a sweep's life and replaced. The learner ranks and
the engines sit on the worker node (custom resource `spot`), the trial drivers on the head. Every
interrupted run must end with the uninterrupted run's metric history, bit for bit, having lost no trial.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from faults import (
    TRIAL,
    check_confirmation_records,
    committed,
    fault_metrics,
    history,
    logged_step,
    logged_steps,
    reference_history,
    runs,
    sweep_spec,
    trial_cfg,
)

from orchestrator.launch import check_shared_storage, trial_demand, trials_that_fit

SPOT = ["learner.resources={spot: 1}", "rollout.resources={spot: 1}"]  # two ranks and one engine per node
WORKER = {"num_cpus": 3, "resources": {"spot": 3}}
TRIAL_STEPS = 5  # faults.TRIAL's learner.steps
ENV = {"RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "1"}  # Ray Train's drain watcher (5 s by default) within a step


@pytest.fixture(scope="module")
def cluster(tiny_model_path):
    import ray
    from ray.cluster_utils import Cluster

    from orchestrator.launch import WORKER_ENV, init_ray

    ray.shutdown()  # the suite's one-node cluster: the next module that needs it starts it again
    os.environ.update(WORKER_ENV)
    with pytest.MonkeyPatch.context() as env:
        for key, value in ENV.items():  # the raylets, and every process they start, inherit it
            env.setenv(key, value)
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
        cluster.add_node(**WORKER)
        env.setenv("RAY_ADDRESS", cluster.address)  # as a driver joins a real cluster
        init_ray(0)
        yield cluster
        ray.shutdown()
        cluster.shutdown()


def spot_node(cluster):
    (node,) = [n for n in cluster.worker_nodes if n.all_processes]  # the one alive
    return node


def replace(cluster, node) -> None:
    """A spot node reclaimed: its replacement joins, then the node and every process on it vanish."""
    cluster.add_node(**WORKER)
    cluster.remove_node(node, allow_graceful=False)


def command(
    module: str, storage: Path, *overrides: str, spec: str = "search_spaces/ead.yaml", flags: tuple[str, ...] = ()
) -> subprocess.Popen:
    """A CLI driver joining the cluster (RAY_ADDRESS), as on a real one; the test's own thread stays free
    to add and remove nodes (Ray starts a node only from a process's main thread). Its output goes to a
    file: a pipe nobody reads while the test waits would fill and stop the driver mid-line."""
    sets = [arg for o in [f"storage={storage}", *TRIAL, *SPOT, *overrides] for arg in ("--set", o)]
    log = storage / "driver.log"
    with open(log, "w") as out:
        driver = subprocess.Popen(
            [sys.executable, "-m", f"orchestrator.{module}", spec, *sets, *flags],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    driver.log = log
    return driver


def wait_until(ready, driver: subprocess.Popen, timeout_s: float = 600) -> None:
    deadline = time.time() + timeout_s
    while not ready():
        assert driver.poll() is None, driver.log.read_text()[-3000:]  # ended before the fault could strike
        assert time.time() < deadline, "timed out"
        time.sleep(0.2)


def finish(driver: subprocess.Popen) -> str:
    driver.wait(timeout=900)
    out = driver.log.read_text()
    assert driver.returncode == 0, out[-3000:]
    return out


@pytest.fixture(scope="module")
def reference(cluster, tmp_path_factory) -> dict:
    return reference_history(tmp_path_factory)


@pytest.mark.faults
@pytest.mark.slow
def test_a_drained_node_checkpoints_first_then_the_trial_moves(cluster, reference, tmp_path):
    """`ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION` (the autoscaler's and KubeRay's notice) on the
    node of the ranks and the engine: the trial checkpoints at its next step boundary (it checkpoints
    nowhere else here), the node goes, and the trial goes on from that checkpoint on the replacement."""
    node = spot_node(cluster)
    driver = command("train", tmp_path, "checkpoint.every=0")
    wait_until(lambda: logged_step(tmp_path) >= 1, driver)
    subprocess.run(
        [
            str(Path(sys.executable).parent / "ray"),
            "drain-node",
            "--address",
            cluster.address,
            "--node-id",
            node.node_id,
            "--reason",
            "DRAIN_NODE_REASON_PREEMPTION",
            "--reason-message",
            "spot reclaim",
            "--deadline-remaining-seconds",
            "120",
        ],
        check=True,
    )
    wait_until(lambda: committed(tmp_path) >= [1], driver)
    replace(cluster, node)
    assert "drains: checkpointed after step" in finish(driver)
    assert history(tmp_path) == reference
    (resumed_from,) = fault_metrics(tmp_path)["faults/resumed_from_step"]
    assert 2 <= resumed_from <= 4  # the notice's checkpoint: the only one before the last step


@pytest.mark.faults
@pytest.mark.slow
def test_sigterm_to_a_learner_process_checkpoints_then_restarts(cluster, reference, tmp_path):
    driver = command("train", tmp_path, "checkpoint.every=0")
    wait_until(lambda: logged_step(tmp_path) >= 2, driver)
    pids = subprocess.run(["pgrep", "-f", "ray::RayTrainWorker"], capture_output=True, text=True).stdout.split()
    os.kill(int(pids[-1]), signal.SIGTERM)
    assert "a learner process got SIGTERM: checkpointed after step" in finish(driver)
    assert history(tmp_path) == reference
    (resumed_from,) = fault_metrics(tmp_path)["faults/resumed_from_step"]
    assert 3 <= resumed_from <= 4


# The moments a sweep's spot node can vanish, in the order a sweep of two trials and its confirmation (two
# fresh seed pairs) meet them; each is found from the sweep's own progress (MLflow's steps, Ray Train's
# committed checkpoints, the runs it has made), and the node is replaced after each: one sweep loses its
# node five times.
NODE_KILLS = {
    "first_trial_mid_step": lambda s: logged_steps(s)[:1] >= [2],  # step 3 under way
    "first_trial_after_its_last_step": lambda s: logged_steps(s)[:1] >= [TRIAL_STEPS],
    "between_configurations": lambda s: closed_finished(s) >= 1,
    "second_trial_after_a_checkpoint": lambda s: logged_steps(s)[1:2] >= [3] and committed(s)[1:2] >= [1],
    # a confirmation seed past its first checkpoint: the selection over, the verdict not yet made
    "mid_confirmation": lambda s: max(logged_steps(s, "confirm"), default=0) >= 3,
}


def closed_finished(storage: Path) -> int:
    """Trial runs the sweep has closed as finished (its Tune callback, once Tune recorded the trial)."""
    try:
        return sum(r.data.tags.get("state") == "finished" for r in runs(storage))
    except Exception:  # noqa: BLE001 - the store is still being created
        return 0


@pytest.mark.faults
@pytest.mark.slow
@pytest.mark.parametrize("moments", ["+".join(NODE_KILLS)], ids=str)  # the test id names the kill points
def test_a_sweep_loses_no_trial_whenever_its_spot_node_vanishes(cluster, reference, tmp_path, moments):
    """Two trials, the second with the reference's settings, then their confirmation; the node of their
    ranks and engines is taken away at each moment of NODE_KILLS and replaced. The driver, on the head,
    lives on: every trial ends finished in MLflow, Optuna and Tune, each step logged once, the second's
    history the uninterrupted one bit for bit; the verdict is the one its confirmation seeds give."""
    driver = command(
        "sweep",
        tmp_path,
        "search.confirm={seeds: 2, max_seeds: 2}",
        spec=str(sweep_spec(tmp_path)),
        flags=("--name", "s", "--num-samples", "2"),
    )
    for moment in moments.split("+"):
        wait_until(lambda: NODE_KILLS[moment](tmp_path), driver)
        replace(cluster, spot_node(cluster))
    out = finish(driver)
    trials = {
        r.data.params["rollout.decoding.ead.tau_max"]: r for r in runs(tmp_path) if r.data.tags["stage"] == "select"
    }
    assert sorted(trials) == ["1.0", "1.2"], out[-3000:]
    assert {(r.data.tags["state"], r.info.status) for r in trials.values()} == {("finished", "FINISHED")}
    for run in trials.values():
        assert [s for s, _ in history(tmp_path, run)["progress/step"]] == list(range(1, TRIAL_STEPS + 1))
    assert history(tmp_path, trials["1.2"]) == reference
    assert fault_metrics(tmp_path, trials["1.2"])["faults/resumed_from_step"]  # it did lose its node
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's' / 'optuna.db'}")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 2
    tune = [
        json.loads(line)
        for p in sorted((tmp_path / "s" / "tune").glob("trainable_*/result.json"))
        for line in p.read_text().splitlines()[-1:]
    ]
    assert [r["progress/step"] for r in tune] == [TRIAL_STEPS] * 2  # Tune's record: each at its last step
    check_confirmation_records(tmp_path, out)


def test_configurations_that_cannot_all_fit_run_in_turn(cluster, tmp_path):
    """Two ranks and one engine fill the spot node: a second configuration's run started beside the first
    would hold its engine and wait for ever for its ranks, as the first would for its second rank. So one
    at a time (a configuration's seeds share one run: trainables/group.py)."""
    import ray

    deadline = time.time() + 120  # a node the test before took away counts until Ray has marked it dead
    while ray.cluster_resources().get("spot") != WORKER["resources"]["spot"]:
        assert time.time() < deadline, ray.cluster_resources()
        time.sleep(1)
    cfg = trial_cfg(tmp_path, *SPOT)
    assert trial_demand(cfg) == {"CPU": 3.0, "spot": 3.0}  # 2 ranks x (1 CPU, 1 spot) + 1 engine x (1, 1)
    assert trials_that_fit(cfg, 3) == 1
    one_rank = trial_cfg(tmp_path, "learner.resources={spot: 1}", "learner.num_workers=1")  # its engine anywhere
    assert trial_demand(one_rank) == {"CPU": 2.0, "spot": 1.0}
    assert trials_that_fit(one_rank, 3) == 2  # the cluster's 4 CPUs hold two


def test_a_folder_on_one_machine_serves_a_cluster_on_one_machine(cluster, tmp_path):
    check_shared_storage(str(tmp_path))  # every raylet here runs on this host: nothing to refuse
