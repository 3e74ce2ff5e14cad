"""MLflow records: a sqlite store inside the run's storage folder unless a tracking URI is given.

A tracking server that is down never stops a trial: each call is retried with backoff, and when
the server stays away the run goes on untracked (Ray Train still keeps its reported results) and
says so in one line.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
import subprocess
import time
import urllib.parse
from contextlib import closing
from pathlib import Path
from typing import Any

import yaml
from mlflow.entities import Metric, Param, RunStatus
from mlflow.tracking import MlflowClient

from orchestrator import view
from orchestrator.inputs import SpecError
from trainables.config import TrialConfig

log = logging.getLogger(__name__)
# MLflow's notes on creating and migrating a new store's tables: each new storage folder's log opened with them.
logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)

# The MLflow UI's experiment types: "custom_model_development" is its "Machine learning" kind (runs, charts).
EXPERIMENT_KIND, TRAINING = "mlflow.experimentKind", "custom_model_development"
# A run's state tag -> its MLflow status. The MLflow UI draws KILLED with FAILED's red cross, so a trial
# the scheduler pruned (its record complete to the step where it was judged) is FINISHED, with state
# `pruned` and a description saying so; a trial stopped to be resumed is KILLED (it has more to do);
# anything else that ended is a failure.
STATUS = {"finished": RunStatus.FINISHED, "pruned": RunStatus.FINISHED, "stopped": RunStatus.KILLED}
DESCRIPTION = {
    "pruned": "Pruned: the scheduler stopped this trial early; its metrics end where it was judged.",
    "stopped": "Stopped to be resumed (--resume continues it).",
}
MAX_PARAM_LENGTH = 6000  # MLflow's limit on a parameter value
RETRY_WAITS_S = (1, 2, 4, 8, 16)  # ~30 s: long enough for a tracking server to restart


def default_tracking_uri(storage: str) -> str:
    folder = Path(storage).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'mlflow.db'}"


def artifact_location(tracking_uri: str) -> str | None:
    """Artifacts of a sqlite store go beside it (`<storage>/mlartifacts`); a server keeps its own default."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    return (Path(tracking_uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()


# The tag of an experiment whose artifacts live beside its sqlite store: they move with the folder.
BESIDE = ("rlvr.artifacts", "beside the store")
# The columns where a sqlite store's client writes a file URI of the folder the store was in.
ARTIFACT_COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
    ("model_versions", "source"),
    ("model_versions", "storage_location"),
)


def open_store(tracking_uri: str) -> MlflowClient:
    """A client of the store; a sqlite store's artifact records first re-pointed at its folder (`rebase`)."""
    if tracking_uri.startswith("sqlite:///"):
        rebase(Path(tracking_uri.removeprefix("sqlite:///")))
        # MLflow keeps each run's artifact location for the process, by run id: a copy of a store opened in the
        # same process would write its artifacts into the original's folder.
        from mlflow.tracking._tracking_service import utils

        getattr(utils, "_artifact_repos_cache", {}).clear()
    return MlflowClient(tracking_uri)


def rebase(db: Path) -> int:
    """Make a copied or moved storage folder whole again; the rows changed (0 where nothing moved).

    A sqlite store's client can only record absolute file URIs (`<folder>/mlartifacts/...`): after a
    move they name the old place, where the artifacts no longer are. Every record under another folder's
    `.../mlartifacts` root is re-pointed at this folder's, so MLflow's client, `mlflow ui` and the report
    open every artifact from where the folder is now. Only experiments made here with their artifacts
    beside the store (tag `BESIDE`) are moved: one given a folder of its own keeps it."""
    if not db.is_file():
        return 0
    new = (db.parent / "mlartifacts").as_uri()
    try:
        return _rebase(db, new)
    except sqlite3.OperationalError as e:  # busy past the timeout, or a schema still being made: next open
        log.warning("%s: artifact records not checked for a move (%s)", db, e)
        return 0
    except sqlite3.DatabaseError as e:
        raise SpecError(f"{db}: not an MLflow sqlite store ({e})") from None


def _rebase(db: Path, new: str) -> int:
    with closing(sqlite3.connect(db, timeout=60)) as con, con:
        tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "experiments" not in tables:
            return 0
        roots = {
            loc
            for (loc,) in con.execute(
                "SELECT e.artifact_location FROM experiments e"
                " JOIN experiment_tags t ON t.experiment_id = e.experiment_id WHERE t.key = ? AND t.value = ?",
                BESIDE,
            )
            if loc.startswith("file://") and loc != new
        }
        changed = 0
        for old in roots:
            changed += sum(
                _replace_prefix(con, table, column, old, new) for table, column in ARTIFACT_COLUMNS if table in tables
            )
            # A trial run's identity (tag run_path, <storage>/<name>): a --resume in the moved folder finds it.
            folder = urllib.parse.unquote(urllib.parse.urlparse(old).path).removesuffix("/mlartifacts")
            changed += _replace_prefix(con, "tags", "value", folder, str(db.parent), "key = 'run_path'")
    return changed


def _replace_prefix(con, table: str, column: str, old: str, new: str, where: str = "1") -> int:
    """`old` -> `new` at the start of `column` where it is the whole value or a path's leading folders."""
    n = len(old)
    return con.execute(
        f"UPDATE {table} SET {column} = ? || substr({column}, ?) WHERE {where} AND "
        f"substr({column}, 1, ?) = ? AND (length({column}) = ? OR substr({column}, ?, 1) = '/')",
        (new, n + 1, n, old, n, n + 1),
    ).rowcount


def ui_hint(tracking_uri: str) -> str:
    """How to open the store: a storage folder's through `orchestrator.ui` (which also works on a moved
    copy), any other sqlite file through `mlflow ui`, a server at its address."""
    db = Path(tracking_uri.removeprefix("sqlite:///"))
    if tracking_uri.startswith("sqlite:///") and db.name == "mlflow.db":
        return f"python -m orchestrator.ui {db.parent}  (the MLflow UI on http://127.0.0.1:5000)"
    if tracking_uri.startswith("sqlite:///"):
        return f"mlflow ui --backend-store-uri {tracking_uri} --host 127.0.0.1"
    return tracking_uri


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay values."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def unflatten(params: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The section under `prefix` of flattened params, nested again: {"p.a.b": 1} -> {"a": {"b": 1}}."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key.startswith(prefix):
            *parents, leaf = key.removeprefix(prefix).split(".")
            node = out
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
    return out


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=Path(__file__).parent
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def unreachable(error: BaseException) -> bool:
    """Whether an error is the store being out of reach (worth another try), not a refusal."""
    import requests

    if isinstance(error, (ConnectionError, TimeoutError, requests.exceptions.RequestException)):
        return True
    text = str(error)  # MLflow wraps its HTTP client's failures in an MlflowException
    return any(s in text for s in ("Max retries exceeded", "Connection refused", "timed out", "database is locked"))


def tags_filter(**tags: str) -> str:
    """An MLflow search filter matching every tag exactly; a value with an apostrophe is quoted with
    double quotes (MLflow's filter grammar has no escape), one with both kinds is refused."""

    def quoted(value: str) -> str:
        if "'" not in value:
            return f"'{value}'"
        if '"' not in value:
            return f'"{value}"'
        raise ValueError(f"{value!r} holds both kinds of quote; MLflow cannot search for it")

    return " and ".join(f"tags.{key} = {quoted(str(value))}" for key, value in tags.items())


def training_experiment(client, name: str, uri: str) -> str:
    """The id of experiment `name` in the store at `uri`: created if new, its tags brought up to date if
    made by an older version (no kind; artifacts beside the store without saying so)."""
    found = client.get_experiment_by_name(name)
    if found is None:
        beside = artifact_location(uri)
        return client.create_experiment(
            name, artifact_location=beside, tags={EXPERIMENT_KIND: TRAINING, **(dict([BESIDE]) if beside else {})}
        )
    if EXPERIMENT_KIND not in found.tags:  # made before experiments had a kind
        client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND, TRAINING)
    if found.artifact_location == artifact_location(uri) and BESIDE[0] not in found.tags:
        client.set_experiment_tag(found.experiment_id, *BESIDE)  # made before folders moved
    return found.experiment_id


def retried(what: str, *, needs_run: bool = False):
    """A Tracker method that tries again while the store is unreachable (`Tracker._retried`) and returns None
    once it stays so or refuses: training goes on without its record. `needs_run`: a call for no run (its
    first argument None: the store was unreachable when it was made) does nothing."""

    def wrap(method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            if needs_run and args[0] is None:
                return None
            return self._retried(what, method, self, *args, **kwargs)

        return call

    return wrap


class Tracker:
    """Creates and closes runs; the trial's rank 0 logs the per-step metrics into them.

    Every public method retries, then gives up with a warning and returns None: a run that cannot
    be created is a trial without a record, never a trial that does not run.
    """

    def __init__(self, tracking_uri: str, experiment: str, retry_waits_s: tuple[float, ...] = RETRY_WAITS_S):
        self.uri = tracking_uri
        self.experiment = experiment
        self.retry_waits_s = retry_waits_s
        self.client = open_store(tracking_uri)
        self._experiment_id: str | None = None

    @property
    def experiment_id(self) -> str:
        """The experiment, created as model training (the MLflow UI then opens on runs and charts, not GenAI
        traces) with its artifacts beside a sqlite store, so that a storage folder holds its whole record."""
        if self._experiment_id is None:
            self._experiment_id = training_experiment(self.client, self.experiment, self.uri)
        return self._experiment_id

    @retried("saving the sweep's view in MLflow")
    def trials_view(
        self, sweep: str, metric: str, params: list[str], server: str = "http://127.0.0.1:5000"
    ) -> str | None:
        """The link a sweep prints: the MLflow UI on a view of the sweep's trial runs (`orchestrator.view`),
        saved in the experiment; None before a call has found the experiment, or where it cannot be saved."""
        if not self._experiment_id:
            return None
        trials = tags_filter(sweep=sweep, kind="trial")
        runs = self.client.search_runs([self._experiment_id], trials, max_results=1)
        logged = sorted(runs[0].data.metrics) if runs else []
        charts = [m for m in (f"{metric}_se", "rollout/accuracy", "policy/entropy") if m in logged]
        tag, value = view.saved_view(view.sweep_view(metric, charts, logged, params, trials), f"sweep {sweep}")
        self.client.set_experiment_tag(self._experiment_id, tag, value)
        return view.view_link(server, self._experiment_id, tag)

    def _retried(self, what: str, fn, *args, **kwargs):
        """fn(*args, **kwargs), tried again while the store is unreachable; None once it stays so, or refuses."""
        for attempt, wait in enumerate((*self.retry_waits_s, None)):
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - whatever the store raises, training goes on
                if not unreachable(e):  # a refusal: trying again would be refused again
                    log.warning(
                        "MLflow at %s refused %s: %s: %s; continuing without it", self.uri, what, type(e).__name__, e
                    )
                    return None
                if wait is None:
                    log.warning(
                        "MLflow at %s unreachable (%s) after %d tries: %s; continuing without it",
                        self.uri,
                        what,
                        attempt + 1,
                        e,
                    )
                    return None
                time.sleep(wait)

    @retried("creating the trial run")
    def start_trial_run(
        self,
        cfg: TrialConfig,
        *,
        parent_run_id: str | None = None,
        tags: dict[str, str] | None = None,
        resume: bool = False,
        run_name: str | None = None,
    ) -> str | None:
        """The trial's run (named `run_name`, default the trial's name): with `resume`, the run already
        recording this Train run (reopened), if any."""
        run_path = f"{cfg.storage.rstrip('/')}/{cfg.name}"  # where Ray Train keeps the run: its identity
        if resume and (found := self._trial_run(run_path)):
            return self._reopen(found.info.run_id)
        all_tags = {
            "algorithm": cfg.algorithm.name,
            "git_commit": git_commit(),
            "state": "running",
            "run_path": run_path,
            **(tags or {}),
        }
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=run_name or cfg.name, tags=all_tags)
        run_id = run.info.run_id
        self.log_params(run_id, flatten(cfg.model_dump(mode="json")))
        self.client.log_text(run_id, yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), "spec.yaml")
        return run_id

    @retried("reading the run's final value")
    def finished_value(self, run_path: str, metric: str, steps: int) -> float | None:
        """`metric` of the run recording the Train run at `run_path`, if it is closed `finished` at step
        `steps`; else (none, short, open, or the store unreachable) None."""
        run = self._trial_run(run_path)
        m = run.data.metrics if run is not None and run.data.tags.get("state") == "finished" else {}
        return m.get(metric) if m.get("progress/step") == steps else None

    @retried("finding the trial run")
    def find_trial_run(self, run_path: str) -> str | None:
        """The id of the run recording the Train run at `run_path` (<storage>/<name>), if any."""
        run = self._trial_run(run_path)
        return run.info.run_id if run is not None else None

    def _trial_run(self, run_path: str):
        """The newest run recording the Train run at `run_path`, or None."""
        found = self.client.search_runs(
            [self.experiment_id], tags_filter(run_path=run_path), order_by=["attributes.start_time DESC"], max_results=1
        )
        return found[0] if found else None

    @retried("logging the evaluation")
    def log_evaluation(
        self,
        name: str,
        *,
        params: dict[str, Any],
        metrics: dict[str, float],
        artifact: Path,
        parent_run_id: str | None = None,
    ) -> str | None:
        """A finished evaluation run (nested under a trial's run when given): its table and results file."""
        tags = {"kind": "evaluation", "git_commit": git_commit()}
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run_id = self.client.create_run(self.experiment_id, run_name=name, tags=tags).info.run_id
        self.log_params(run_id, params)
        self.log_metrics(run_id, metrics)
        self.client.log_artifact(run_id, str(artifact))
        self._finish(run_id, "finished")
        return run_id

    @retried("registering the model")
    def register_model(self, run_id: str, folder: Path, name: str) -> str | None:
        """Log a model folder with the run (artifact path `model`) and register it; the new version."""
        from mlflow.exceptions import MlflowException

        self.client.log_artifacts(run_id, str(folder), "model")
        try:
            self.client.create_registered_model(name)
        except MlflowException as e:
            if "already exists" not in str(e).lower():
                raise
        source = f"{self.client.get_run(run_id).info.artifact_uri}/model"
        return self.client.create_model_version(name, source, run_id=run_id).version

    @retried("creating the sweep run")
    def start_sweep_run(
        self, name: str, *, spec_text: str, search: dict[str, Any], resume: bool = False, kind: str = "sweep"
    ) -> str | None:
        """The parent run of a sweep (or a study: `kind`): its spec, search space and commit; trials nest
        under it."""
        if resume:
            found = self.client.search_runs(
                [self.experiment_id],
                tags_filter(kind="sweep", sweep=name),
                order_by=["attributes.start_time DESC"],
                max_results=1,
            )
            if found:
                return self._reopen(found[0].info.run_id)
        run = self.client.create_run(
            self.experiment_id,
            run_name=name,
            tags={
                "kind": "sweep",
                "sweep": name,
                "git_commit": git_commit(),
                "state": "running",
                "experiment_kind": kind,
            },
        )
        # The settings as params (metric, mode, seeds, ...); the space, points and arms as one readable file.
        section = "search" if kind == "sweep" else kind
        self.log_params(
            run.info.run_id,
            {f"{section}.{k}": v for k, v in search.items() if v is not None and not isinstance(v, (dict, list))},
        )
        self.client.log_text(run.info.run_id, yaml.safe_dump(search, sort_keys=False), f"{section}.yaml")
        self.client.log_text(run.info.run_id, spec_text, "sweep_spec.yaml")
        return run.info.run_id

    @retried("closing the sweep run", needs_run=True)
    def finish_sweep(
        self,
        run_id: str | None,
        best: dict[str, Any],
        budget: dict[str, float],
        *,
        metrics: dict[str, float] | None = None,
        tags: dict[str, str] | None = None,
        tables: dict[str, str] | None = None,
        description: str = "",
    ) -> None:
        """Close the parent run with the best configuration, the verdict's metrics and tags, tables, and the
        verdict in words as the run page's description."""
        objective = {} if best.get("metric") is None else {"best/objective": best["metric"]}
        finite = {k: v for k, v in (metrics or {}).items() if v == v}  # a NaN bound (one seed) is left out
        self.log_metrics(run_id, {**objective, **finite, **{f"sweep/{k}": v for k, v in budget.items()}})
        for key, value in {
            **({"best_trial": str(best["trial_id"])} if "trial_id" in best else {}),
            **(tags or {}),
        }.items():
            self.client.set_tag(run_id, key, value)
        self.log_params(run_id, {f"best.{k}": v for k, v in best.get("params", {}).items()})
        if best:
            self.client.log_text(run_id, yaml.safe_dump(best, sort_keys=False), "best_trial.yaml")
        for name, text in (tables or {}).items():
            self.client.log_text(run_id, text, name)
        self._finish(run_id, "finished", description)

    @retried("finding the configuration's runs")
    def config_run_ids(self, sweep: str, config: str) -> list[str] | None:
        """The runs of one configuration of a sweep or study (one per seed)."""
        return [
            r.info.run_id for r in self.client.search_runs([self.experiment_id], self._config_filter(sweep, config))
        ]

    def config_seeds(self, sweep: str, config: str, metric: str) -> list[tuple[int, int, float | None]]:
        """Each seed run of one configuration, in seed order: (RL steps it logged, its learner.steps, its
        latest `metric`): the configuration's own record, whatever Tune kept."""
        runs = (
            self._retried(
                "reading the configuration's runs",
                lambda: self.client.search_runs([self.experiment_id], self._config_filter(sweep, config)),
            )
            or []
        )
        return [
            (
                int(r.data.metrics.get("progress/step", 0)),
                int(r.data.params.get("learner.steps", 0)),
                r.data.metrics.get(metric),
            )
            for r in sorted(runs, key=lambda r: int(r.data.params.get("seed", 0)))
        ]

    @staticmethod
    def _config_filter(sweep: str, config: str) -> str:
        return tags_filter(sweep=sweep, config=config) + " and tags.stage != 'confirm'"  # the search's runs

    @retried("logging the configuration's interval")
    def log_config_metrics(self, sweep: str, config: str, metrics: dict[str, float]) -> None:
        """The same metrics on every seed run of one configuration of a sweep or study."""
        for run in self.client.search_runs([self.experiment_id], self._config_filter(sweep, config)):
            self.log_metrics(run.info.run_id, metrics)

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        batch = [Param(k, str(v)[:MAX_PARAM_LENGTH]) for k, v in params.items()]
        for i in range(0, len(batch), 100):  # MLflow's per-batch parameter limit
            self.client.log_batch(run_id, params=batch[i : i + 100])

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        batch = [Metric(k, float(v), int(time.time() * 1000), step) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):  # MLflow's batch limit
            self.client.log_batch(run_id, metrics=batch[i : i + 1000])

    @retried("logging the offline store", needs_run=True)
    def log_offline_store(self, run_id: str | None, store) -> None:
        """What the OGER paper's Table 1 reports, per teacher: as metrics and as a table artifact."""
        self.log_metrics(run_id, store.metrics())
        self.client.log_text(run_id, store.format_table(), "offline_store.txt")

    @retried("closing the run", needs_run=True)
    def finish(self, run_id: str | None, state: str) -> None:
        self._finish(run_id, state)

    @retried("closing the run", needs_run=True)
    def close_if_running(self, run_id: str | None, state: str) -> None:
        """Close a run still marked running (a command that ended by an error or Ctrl-C) as `state`."""
        if self.client.get_run(run_id).info.status == "RUNNING":
            self._finish(run_id, state)

    @retried("closing the trial run")
    def finish_sweep_trial(self, sweep: str, trial_id: str, state: str, description: str | None = None) -> None:
        """Close a sweep trial's runs, found by their tags (the Tune callback knows no run id)."""
        for run in self.client.search_runs([self.experiment_id], tags_filter(sweep=sweep, trial_id=trial_id)):
            self._finish(run.info.run_id, state, description)

    def _finish(self, run_id: str, state: str, description: str | None = None) -> None:
        self.client.set_tag(run_id, "state", state)
        # the run page's description
        self.client.set_tag(run_id, "mlflow.note.content", description or DESCRIPTION.get(state, ""))
        status = STATUS.get(state, RunStatus.FAILED)
        self.client.set_terminated(run_id, RunStatus.to_string(status))

    def _reopen(self, run_id: str) -> str:
        """A run continued by --resume: running again, and counted."""
        run = self.client.get_run(run_id)
        self.client.update_run(run_id, status="RUNNING")
        self.client.set_tag(run_id, "state", "running")
        self.client.set_tag(run_id, "mlflow.note.content", "")
        self.client.set_tag(run_id, "resumes", str(int(run.data.tags.get("resumes", "0")) + 1))
        return run_id

    def metric_history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in self.client.get_metric_history(run_id, key)]
