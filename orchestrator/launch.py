"""Launching trials: the preamble `train`, `sweep` and `study` share (the run folder claimed, then Ray and
MLflow started), the local or remote Ray cluster, a trial's actors (rollout engines, verifier,
encoder) and its Ray Train run, and where runs are stored. `orchestrator.train`, `.sweep`, `.study`,
`.evaluate` and `bench` all start their trials through here.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator import MLFLOW_HTTP_ENV, TQDM_OFF_TERMINAL, WEIGHTS_ONLY_ENV
from orchestrator.console import console
from orchestrator.lease import Lease, check_settings
from orchestrator.preempt import StopRequest
from orchestrator.spec import SpecError
from trainables.config import TrialConfig
from trainables.data.offline import OfflineStore
from trainables.rewards.verify import score_batch
from trainables.tasks import load_offline_store, train_problems
from trainables.verifier import start_verifier

if TYPE_CHECKING:
    from orchestrator.tracking import Tracker


# Environment of every Ray worker: DeepSpeed on CPU torch, quiet tokenizers, no hub access.
WORKER_ENV = {
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "DS_ACCELERATOR": "cpu",
    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "180",
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",  # Train's print-to-logger patch shows every line twice
    "PYTHONWARNINGS": "ignore::FutureWarning,ignore::DeprecationWarning",
    # A dead tracking server costs a step seconds: the step logger buffers and tries again at the next step.
    **MLFLOW_HTTP_ENV,
    **WEIGHTS_ONLY_ENV,  # a checkpoint is data: no torch.load unpickles objects (trainables/runtime/checkpoint.py)
}


def logical_cpus(cfg: TrialConfig) -> int:
    """Logical CPUs for a local cluster: at least what one trial asks, whatever the cores.

    Rollout and learner phases alternate, so oversubscribing the cores is cheap; without it a
    2-core machine cannot even place one worker group.
    """
    need = trial_demand(cfg).get("CPU", 0.0) + 1  # and one for the driver's own work
    return max(int(need + 0.999), os.cpu_count() or 1)


def worker_resources(cfg: TrialConfig) -> dict[str, float]:
    """One learner rank's resources; colocated, it leaves room on its GPU for the rollout engine."""
    resources = {"CPU": cfg.learner.cpus_per_worker, **cfg.learner.resources}
    if cfg.learner.use_gpu:
        resources["GPU"] = 1 - cfg.rollout.num_gpus if cfg.rollout.colocate else 1
    return resources


def trial_demand(cfg: TrialConfig) -> dict[str, float]:
    """What one trial reserves of a cluster: its learner ranks', its engines' and its encoder's resources
    (its verifier and Ray Train's own actors take none)."""
    from trainables.rollout.service import engine_bundle

    demand: dict[str, float] = {}
    parts = [
        (worker_resources(cfg), cfg.learner.num_workers),
        (engine_bundle(cfg.rollout), cfg.rollout.num_engines),
        ({"CPU": cfg.encoder.num_cpus if cfg.preset.needs_embeddings else 0.0}, 1),
    ]
    for resources, count in parts:
        for key, value in resources.items():
            demand[key] = demand.get(key, 0.0) + value * count
    return {key: value for key, value in demand.items() if value}


def trials_that_fit(cfg: TrialConfig, wanted: int) -> int:
    """Trials of `cfg` to run at once, of `wanted`: as many as the cluster's resources hold now, at least
    one (an autoscaling cluster adds nodes as a trial asks). Trials started past that number would each
    reserve part of what they need (engines first, then ranks) and wait for one another for ever."""
    import ray

    have, demand = ray.cluster_resources(), trial_demand(cfg)
    fits = min((int(have.get(key, 0.0) // need) for key, need in demand.items()), default=wanted)
    held = f"the cluster's {resources_text(have)} hold {fits} trial(s) of {resources_text(demand)}"
    if fits == 0:  # none fits yet: an autoscaling cluster adds the nodes its waiting trials ask for
        console.print(f"{held}: {wanted} at once, as the cluster grows", highlight=False)
        return wanted
    if fits < wanted:
        console.print(f"{fits} trial(s) at once: {held}", highlight=False)
    return min(wanted, fits)


def resources_text(resources: dict[str, float]) -> str:
    """`CPU 4, GPU 2, spot 3`: the resources a person sets (not Ray's per-node and memory entries)."""
    return ", ".join(
        f"{key} {value:g}"
        for key, value in sorted(resources.items())
        if not key.startswith("node:")
        and not key.startswith("accelerator_type")
        and key not in ("memory", "object_store_memory")
    )


def init_ray(num_cpus: int) -> None:
    import ray

    if ray.is_initialized():
        return
    os.environ.update({k: v for k, v in WORKER_ENV.items() if k not in os.environ})
    env = {**WORKER_ENV, **TQDM_OFF_TERMINAL}  # a worker's output is a pipe
    address = os.environ.get("RAY_ADDRESS")  # a running cluster (infra/) when set
    # logging_level: Ray's own INFO lines (its start banner, with colour codes whatever the output) off.
    if address:
        ray.init(address=address, runtime_env={"env_vars": env}, log_to_driver=True, logging_level=logging.WARNING)
    else:
        # A cluster of this process, on 127.0.0.1: its token-authentication notice is for shared clusters.
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
        # The dashboard serves the State API; without it Ray Train's placement-group cleaner warns
        # about it every few seconds.
        ray.init(
            num_cpus=num_cpus,
            runtime_env={"env_vars": env},
            include_dashboard=True,
            dashboard_host="127.0.0.1",
            log_to_driver=True,
            logging_level=logging.WARNING,
        )


def run_folder(storage: str, name: str) -> str:
    """Where a run named `name` keeps its records in `storage` (a folder or a URI)."""
    return f"{storage_uri(storage).rstrip('/')}/{name}"


def claim_folder(what: str, storage: str, name: str, settings: dict, *, resume: bool, force: bool) -> Lease:
    """The first half of the preamble `train`, `sweep` and `study` share: hold the run folder's lease (one
    writer at a time; released at exit) and check the settings recorded there against these."""
    folder = run_folder(storage, name)
    lease = Lease(folder)
    lease.acquire(what)
    check_settings(folder, settings, resume=resume, force=force)
    return lease


def start_cluster(
    storage: str, name: str, *, cpus: int, tracking_uri: str, experiment: str
) -> tuple[Tracker, StopRequest]:
    """Its second half, once the policy (and any teacher store) is ready: start (or join) Ray and check
    the storage serves every node, open the MLflow experiment, clear the stop request that ended the
    last run of this folder."""
    from orchestrator.tracking import Tracker

    init_ray(cpus)
    check_shared_storage(storage)
    stop = StopRequest(run_folder(storage, name))
    stop.clear()
    return Tracker(tracking_uri, experiment), stop


# Filesystems every node of a cluster can mount: a folder on one of them is a storage a cluster can share.
SHARED_FILESYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "lustre", "gpfs", "ceph", "glusterfs", "beegfs", "9p")


def filesystem_type(path: str) -> str:
    """The type of the filesystem holding `path` (its longest mount point in /proc/mounts), or "" unknown."""
    target, best, kind = str(Path(path).expanduser().resolve()), "", ""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return ""
    for line in mounts:
        _, point, fstype, *_ = line.split()
        if (target == point or target.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
            best, kind = point, fstype
    return kind


def storage_problem(storage: str, hosts: set[str], fstype: str) -> str | None:
    """Why `storage` cannot serve a cluster whose nodes run on `hosts` (None: it can). Checkpoints are
    written by learner ranks on any node and read back on whichever node a trial restarts: a folder
    only one machine sees loses them."""
    if "://" in storage or len(hosts) < 2 or fstype in SHARED_FILESYSTEMS or fstype.startswith("fuse."):
        return None
    return (
        f"storage: {storage} is a folder on this machine ({fstype or 'unknown'} filesystem), but the Ray "
        f"cluster has nodes on {len(hosts)} hosts; give a folder every node mounts (NFS, Lustre, ...) or a "
        f"URI (s3://, gs://)"
    )


def check_shared_storage(storage: str) -> None:
    """At start, on the cluster joined: refuse a local-only storage when the nodes span several hosts."""
    import ray

    hosts = {node["NodeManagerHostname"] for node in ray.nodes() if node["Alive"]}
    if problem := storage_problem(storage, hosts, "" if "://" in storage else filesystem_type(storage)):
        raise SpecError(problem)


def load_offline(cfg: TrialConfig, model_path: Path) -> OfflineStore | None:
    """The teacher store of luffy / oger* (None for grpo), its per-teacher table printed."""
    if not cfg.preset.uses_offline:
        return None
    import ray
    from transformers import AutoTokenizer

    train_set = train_problems(cfg)
    score, verifier = score_batch, None
    # A sweep's trial runs in Tune's thread, where math-verify has no time limit (signal.alarm works on a
    # main thread only): there the verifier actor scores the teachers, on its own main thread.
    if threading.current_thread() is not threading.main_thread():
        verifier = start_verifier()
        score = lambda responses, golds: ray.get(verifier.score.remote(responses, golds))  # noqa: E731
    try:
        store = load_offline_store(cfg, AutoTokenizer.from_pretrained(model_path), train_set, score=score)
    except ValueError as e:  # an empty store: the message says why every row was dropped
        raise SpecError(f"offline: {e}") from None
    finally:
        if verifier is not None:
            ray.kill(verifier)
    console.print(f"offline store: {len(store)} teacher trajectories for {len(store.prompts)} prompts")
    print(store.format_table())
    return store


def start_embedder(cfg: TrialConfig, store: OfflineStore | None):
    """The trial's encoder actor (oger* only), its offline embeddings computed or read from the cache."""
    if store is None or not cfg.preset.needs_embeddings:
        return None
    import ray

    from trainables.rewards.embed import EmbeddingService

    offline = {key: [t.text for t in store.for_prompt(key)] for key in sorted(store.prompts)}
    cache = str(Path(cfg.cache_dir).expanduser().resolve() / "embeddings")
    # Restartable like the verifier: a new process reloads the encoder and the cached offline embeddings.
    actor = ray.remote(EmbeddingService).options(
        num_cpus=cfg.encoder.num_cpus, max_restarts=-1, max_task_retries=-1, scheduling_strategy="DEFAULT"
    )  # as the rollout service
    return actor.remote(
        cfg.encoder.model,
        long_text=cfg.encoder.long_text,
        cache_dir=cache,
        batch_size=cfg.encoder.batch_size,
        offline=offline,
        num_threads=max(1, int(cfg.encoder.num_cpus)),
    )


def fit_trial(
    cfgs: list[TrialConfig],
    model_path: Path,
    *,
    name: str,
    tracking_uri: str | None,
    run_ids: list,
    store: OfflineStore | None = None,
    run_callbacks: list | None = None,
    stop_file: str | None = None,
    started_at: float | None = None,
    trust_unsealed: bool = False,
):
    """Start the run's rollout engines and verifier (or borrow a kept set from the sweep's pool: `rollout_set`),
    and its encoder, run one Ray Train loop for the seeds `cfgs` (a configuration's, or one trial), return the `Result`.

    name: the Ray Train run's (a trial's own name when it trains alone); run_ids: each seed's MLflow run in
    `tracking_uri` (None: untracked). `started_at` (time.time()) is where the start-up began, for its
    `timing/startup`. `trust_unsealed`: resume from checkpoints this product did not seal.
    """
    import ray

    from orchestrator.pool import rollout_set
    from trainables.trial import TrialInputs

    cfg, started_at = cfgs[0], started_at or time.time()
    with rollout_set(cfg.rollout, model_path, name) as (engines, verifier, pool):
        embedder = start_embedder(cfg, store)
        try:
            shared = dict(
                model_path=str(model_path),
                engines=engines,
                verifier=verifier,
                tracking_uri=tracking_uri,
                store=store,
                embedder=embedder,
                stop_file=stop_file,
                started_at=started_at,
                fit_at=time.time(),
                run_name=name,
                trust_unsealed=trust_unsealed,
                pool=pool,
            )
            inputs = [TrialInputs(seed, run_id=run_id, **shared) for seed, run_id in zip(cfgs, run_ids, strict=True)]
            return trainer(cfg, inputs, name, run_callbacks or []).fit()
        finally:
            if embedder is not None:
                ray.kill(embedder)


def trainer(cfg: TrialConfig, inputs: list, name: str, run_callbacks: list):
    """The Ray Train run of one configuration's seeds (`inputs`): its worker group, storage, checkpoints kept,
    and the restarts a lost learner rank costs."""
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from trainables.group import train_loop_per_worker
    from trainables.learner import process_group_backend

    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"inputs": inputs},
        torch_config=TorchConfig(backend=process_group_backend(cfg.learner.use_gpu)),
        scaling_config=ScalingConfig(
            num_workers=cfg.learner.num_workers, use_gpu=cfg.learner.use_gpu, resources_per_worker=worker_resources(cfg)
        ),
        run_config=RunConfig(
            name=name,
            storage_path=storage_uri(cfg.storage),
            checkpoint_config=CheckpointConfig(
                num_to_keep=cfg.checkpoint.keep,
                checkpoint_score_attribute=cfg.checkpoint.keep_best_by,
                checkpoint_score_order=cfg.checkpoint.keep_best_mode,
            ),
            # A lost learner rank restarts the worker group from the last checkpoint.
            failure_config=FailureConfig(max_failures=cfg.checkpoint.max_failures),
            logging_config=LoggingConfig(log_level="WARNING"),  # not every report's metrics
            callbacks=run_callbacks,
        ),
    )


def storage_uri(storage: str) -> str:
    return storage if "://" in storage else str(Path(storage).expanduser().resolve())
