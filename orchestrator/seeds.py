"""One configuration, R seeds: the Tune trial of a sweep or a study (`make_trainable`).

The configuration's seeds train in `seed_runs` Ray Train runs (`runs_of`; in each, its seeds take their steps
in turn: trainables/group.py): one run spends the least CPU, and on two cores two runs keep both busy (a
run's rank waits while its engine validates). The trial reports their mean to Tune at each RL step every run
has reached: the searcher and the scheduler compare configurations on means over the same seeds, never on
one seed's luck (Tune's own `Repeater` averages for the searcher only; a scheduler would see single seeds).
Seed r is the spec's seed + r and moves the data order, the sampling and OGER's replacement draws; the
task's problems stay at the spec's seed (`task.seed`), so every seed and every configuration is validated
on the same problems, and two configurations pair seed by seed.

A restarted trial (`--resume`) runs its runs again: every seed continues from its run's latest
checkpoint (each seed's part of it), and a run that had finished reports its final metrics at once.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.console import short_params
from orchestrator.launch import fit_trial, load_offline, trials_that_fit
from orchestrator.relay import SeedReport
from orchestrator.scheduler import pruned_at
from orchestrator.spec import apply_overrides
from orchestrator.stats import seed_interval
from orchestrator.tracking import Tracker
from trainables.config import TrialConfig
from trainables.data.models import resolve_model_path
from trainables.runtime.seed_reports import seed_reports

SE_KEY = "val/accuracy_se"  # the objective's own standard error, reported with val/accuracy
HORIZON_KEY = "progress/steps"  # a configuration's last RL step, in each of its reports
POLL_S = 1.0


def ran_to_end(result: dict) -> bool:
    """Whether a configuration's (last) report is from its last RL step: finished, not pruned or stopped."""
    return result.get("progress/step", 0) >= result.get(HORIZON_KEY, math.inf)


def outcome(result: dict, pruned_step: int | None, seeds: list[tuple[int, int]]) -> str:
    """How a configuration ended, from durable records, never from an absence: `finished` when its last
    report reached the last step, or every seed's own MLflow record did (`seeds`: (RL steps logged,
    learner.steps) each; a driver killed between a trial's last step and Tune's record of it loses
    that report); `pruned` only when the scheduler's record says so; otherwise `errored`: it ended
    short with no decision."""
    if ran_to_end(result) or (seeds and all(done >= last > 0 for done, last in seeds)):
        return "finished"
    return "pruned" if pruned_step is not None else "errored"


def ended(
    result: dict, uri: str | None, config_id: str, seeds_of: Callable[[str], list] | None
) -> tuple[str, int | None, list]:
    """(`outcome`, the step the scheduler stopped it at or None, its seed runs' (steps, learner.steps,
    objective)) of a configuration Tune ended: the scheduler's record under `uri` is read, and then
    `seeds_of(config_id)`, only when its last report does not already decide."""
    if ran_to_end(result):
        return "finished", None, []
    pruned = pruned_at(uri, config_id)
    seeds = (seeds_of(config_id) or []) if seeds_of and pruned is None else []
    return outcome(result, pruned, [(done, last) for done, last, _ in seeds]), pruned, seeds


def seed_name(config_id: str, seed: int) -> str:
    return f"{config_id}_seed{seed}"


def chunks(items: list, parts: int) -> list[list]:
    """`items` in `parts` contiguous runs of as near equal length as can be (the first ones longer)."""
    size, extra = divmod(len(items), parts)
    bounds = [r * size + min(r, extra) for r in range(parts + 1)]
    return [items[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


def part_name(name: str, seeds: list[int], whole: bool) -> str:
    """A run's name: the configuration's (`name`) when it trains all its seeds, else `<name>_seeds<a>-<b>`."""
    return name if whole else f"{name}_seeds{seeds[0]}-{seeds[-1]}"


def run_names(name: str, seeds: list[int], parts: int) -> set[str]:
    """Every name a run of configuration `name` with `seeds` split `parts` ways may take (`runs_of`)."""
    return {name, *(seed_name(name, s) for s in seeds)} | {
        part_name(name, part, False) for part in chunks(seeds, min(parts, len(seeds)))
    }


def runs_at_once(cfg: TrialConfig, seeds: int, parts: int) -> int:
    """The Ray Train runs a configuration of `seeds` seeds split `parts` ways trains at once (`runs_of`)."""
    return seeds if cfg.learner.use_gpu else min(seeds, parts)


def runs_of(name: str, cfgs: list[TrialConfig], parts: int = 1) -> list[tuple[str, list[TrialConfig]]]:
    """The Ray Train runs that train a configuration's seeds `cfgs`, (run name, its seeds): split into
    `parts` runs of contiguous seeds (trainables/group.py: a run's seeds step in turn on one worker group
    and engine set), a seed alone under its own name; on GPU learners one run a seed, as a learner GPU
    holds one seed's model and optimizer states. A seed reaches the same values in any split."""
    if cfgs[0].learner.use_gpu:
        parts = len(cfgs)
    groups = chunks(cfgs, min(parts, len(cfgs)))
    return [
        (group[0].name if len(group) == 1 else part_name(name, [c.seed for c in group], len(groups) == 1), group)
        for group in groups
    ]


def seed_configs(
    base: dict, overrides: dict[str, Any], config_id: str, storage: str, seeds: int | list[int]
) -> list[TrialConfig]:
    """The configuration's trials: seed = the spec's seed + r for r in range(seeds) (or the offsets
    given), the task's problems at the spec's seed."""
    first = TrialConfig.model_validate(apply_overrides(base, overrides))
    offsets = range(seeds) if isinstance(seeds, int) else seeds
    quiet = {} if "progress_every" in (base.get("logging") or {}) else {"logging.progress_every": 0}
    return [
        TrialConfig.model_validate(
            apply_overrides(
                base,
                {
                    **quiet,
                    **overrides,
                    "seed": first.seed + r,
                    "task.seed": first.task_seed,
                    "storage": storage,
                    "name": seed_name(config_id, first.seed + r),
                },
            )
        )
        for r in offsets
    ]


def group_metrics(reports: list[dict[str, float]], metric: str) -> dict[str, float]:
    """The group's report at one step: the mean over seeds of every numeric metric all seeds report,
    the objective's per-seed values (`seeds/<r>/<metric>`), and its 95% interval over seeds
    (`<metric>/ci_low`, `/ci_high`; one seed: from the validation's standard error)."""
    shared = set.intersection(*(set(r) for r in reports))
    out = {
        k: sum(float(r[k]) for r in reports) / len(reports)
        for k in sorted(shared)
        if all(isinstance(r[k], (int, float)) for r in reports)
    }
    if metric in shared:
        values = [float(r[metric]) for r in reports]
        se = out.get(SE_KEY) if len(values) == 1 else None
        interval = seed_interval(values, se)
        out.update({f"{metric}/ci_low": interval.low, f"{metric}/ci_high": interval.high, "seeds": len(values)})
        out.update({f"seeds/{r}/{metric}": v for r, v in enumerate(values)})
    return {k: v for k, v in out.items() if not (isinstance(v, float) and math.isnan(v))}


class SeedGroup:
    """Trains seeds in the runs given (`runs_of`: a configuration's, or a confirmation look's two arms), as
    many at once as the cluster holds, and reports the group's metrics to `report` at each step every seed
    has reached."""

    def __init__(self, runs: list[tuple[str, list[TrialConfig]]], metric: str, report: Callable[[dict], None]):
        self.runs, self.metric, self.report = runs, metric, report
        self.cfgs = [cfg for _, cfgs in runs for cfg in cfgs]
        self.history: list[dict[int, list[dict]]] = [{} for _ in self.runs]  # run -> step -> its seeds' reports
        self.results: list[Any] = [None] * len(self.runs)
        self.errors: list[BaseException | None] = [None] * len(self.runs)
        self.reported = 0

    def run(
        self,
        model_path: Path,
        tracking_uri: str | None,
        run_ids: list,
        stores: list | None = None,
        stop_file: str | None = None,
        trust_unsealed: bool = False,
    ) -> list[dict]:
        """Train every seed, as many runs at once as the cluster holds (`stores`: each run's offline store);
        each seed's final metrics, in the runs' order. A run's error is raised at once: the Tune trial ends,
        and the other runs with it."""
        import ray
        from ray.util.queue import Queue
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # The reports of every run, in arrival order, on this process's node: a queue on a node that is lost
        # would take the group with it, while every run lives through the loss.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        inbox = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": here})
        gate = threading.Semaphore(trials_that_fit(self.cfgs[0], len(self.runs)))
        ids = iter(run_ids)
        threads = [
            threading.Thread(
                target=self._fit,
                name=name,
                daemon=True,
                args=(
                    i,
                    name,
                    cfgs,
                    model_path,
                    tracking_uri,
                    [next(ids) for _ in cfgs],
                    stores[i] if stores else None,
                    stop_file,
                    trust_unsealed,
                    inbox,
                    gate,
                ),
            )
            for i, (name, cfgs) in enumerate(self.runs)
        ]
        for thread in threads:
            thread.start()
        while (any(t.is_alive() for t in threads) or not inbox.empty()) and not any(self.errors):
            try:
                index, metrics = inbox.get(timeout=POLL_S)
            except queue.Empty:
                continue
            self.history[index][int(metrics.get("progress/step", 0))] = seed_reports(metrics)
            self._report_ready(done=[not t.is_alive() for t in threads])
        if not any(self.errors):
            self._report_ready(done=[True] * len(threads))
        for error in self.errors:
            if error is not None:
                raise error
        return [seed for result in self.results for seed in seed_reports(dict(result.metrics or {}))]

    def _fit(
        self,
        index: int,
        name: str,
        cfgs: list[TrialConfig],
        model_path: Path,
        tracking_uri: str | None,
        run_ids: list,
        store,
        stop_file,
        trust_unsealed: bool,
        inbox,
        gate: threading.Semaphore,
    ) -> None:
        try:
            with gate:
                result = fit_trial(
                    cfgs,
                    model_path,
                    name=name,
                    tracking_uri=tracking_uri,
                    run_ids=run_ids,
                    store=store,
                    run_callbacks=[SeedReport(inbox, index)],
                    stop_file=stop_file,
                    trust_unsealed=trust_unsealed,
                )
            self.results[index] = result
            if result.error:
                self.errors[index] = result.error
            elif result.metrics:  # a finished run, resumed, reports nothing new: its last metrics stand
                self.history[index].setdefault(
                    int(result.metrics.get("progress/step", 0)), seed_reports(dict(result.metrics))
                )
        except BaseException as e:  # noqa: BLE001 - raised in the Tune trial's thread
            self.errors[index] = e

    def _report_ready(self, done: list[bool]) -> None:
        """Report every step that all runs have reached (a finished run stands at its last step)."""
        while True:
            step = min((s for h in self.history for s in h if s > self.reported), default=None)
            if step is None:
                return
            reports = []
            for run, finished in zip(self.history, done, strict=True):
                if step in run:
                    reports += run[step]
                elif finished and run and max(run) < step:
                    reports += run[max(run)]
                else:
                    return  # this run has not reached the step yet
            self.reported = step
            self.report(
                {**group_metrics(reports, self.metric), "progress/step": step, HORIZON_KEY: self.cfgs[0].learner.steps}
            )


def run_name(shown: dict[str, str], seed: int) -> str:
    """A seed run's name by what differs: `tau_max=1.25 d0=54 seed=1`, or `arm=ead seed=1`."""
    return " ".join([*(f"{k}={v}" for k, v in shown.items()), f"seed={seed}"])


def make_trainable(base: dict, exp, metric: str, seeds: int, parts: int, arms: dict[str, dict] | None = None):
    """The Tune trial: one configuration (the sampled fields, or a study's arm) trained with `seeds` seeds in
    `parts` Ray Train runs (`runs_of`), each seed its own nested MLflow run (param `seed`, tag `config`)."""
    tracking = {"uri": exp.tracking_uri, "parent_run_id": exp.parent, "sweep": exp.name}
    storage, stop, trust = f"{exp.uri}/trials", exp.stop, exp.trust_unsealed

    def trainable(sampled: dict[str, Any]) -> None:
        from ray import tune

        config_id = tune.get_context().get_trial_id()
        overrides = dict(arms[sampled["arm"]]) if arms is not None else dict(sampled)
        cfgs = seed_configs(base, overrides, config_id, storage, seeds)
        model_path = resolve_model_path(cfgs[0].model, cfgs[0].cache_dir)
        tracker = Tracker(tracking["uri"], cfgs[0].logging.experiment)
        shown = {"arm": sampled["arm"]} if arms is not None else short_params(sampled)
        tags = {
            "kind": "trial",
            "stage": "study" if arms is not None else "select",
            "sweep": tracking["sweep"],
            "trial_id": config_id,
            "config": config_id,
            **shown,
        }
        run_ids = [
            tracker.start_trial_run(
                cfg,
                parent_run_id=tracking["parent_run_id"],
                resume=True,
                tags={**tags, "seed": str(cfg.seed)},
                run_name=run_name(shown, cfg.seed),
            )
            for cfg in cfgs
        ]
        store = load_offline(cfgs[0], model_path)  # the task's seed: the same teachers for every seed
        for run_id in run_ids:
            if store is not None:
                tracker.log_offline_store(run_id, store)
        runs = runs_of(config_id, cfgs, parts)
        results = SeedGroup(runs, metric, tune.report).run(
            model_path, tracking["uri"], run_ids, [store] * len(runs), stop.uri, trust
        )
        # Checkpointed for a resume: stay "running" so that Tune neither closes the trial nor starts
        # another in its place before the driver exits.
        hold_if_preempted(results, tracker, run_ids, stop, config_id)

    return trainable


def hold_if_preempted(results: list[dict], tracker: Tracker, run_ids: list, stop, name: str) -> None:
    """When the seeds checkpointed for a resume (SIGTERM): close their runs `stopped`, tell the driver
    (`stop.acknowledge(name)`), and wait here until the driver exits; otherwise return at once."""
    if any(r.get("progress/preempted") for r in results):
        for run_id in run_ids:
            tracker.finish(run_id, "stopped")
        stop.acknowledge(name)
        while True:
            time.sleep(60)
