"""A configuration's seeds in one Ray Train run (trainables/group.py): each seed's numbers are, bit for bit,
those it reaches trained alone as its own run; the run's report holds every seed's and their mean."""

from __future__ import annotations

import pytest

from orchestrator import launch, train
from orchestrator.spec import load_trial_spec
from orchestrator.tracking import Tracker, default_tracking_uri
from trainables.data.models import resolve_model_path
from trainables.runtime.seed_reports import seed_reports

STEPS = 4


def seed_cfg(storage, seed: int, *extra: str):
    """The default spec's trial at `seed`, its problems at seed 0 (as a sweep's seeds are)."""
    return load_trial_spec(
        "search_spaces/ead.yaml",
        [
            f"storage={storage}",
            f"name=s{seed}",
            f"seed={seed}",
            "task.seed=0",
            f"learner.steps={STEPS}",
            "validation.every=2",
            "validation.num_prompts=32",
            "checkpoint.every=2",
            *extra,
        ],
    )


def histories(tracker: Tracker, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Every metric the run logged at every step, but wall-clock times and the record of faults."""
    keys = tracker.client.get_run(run_id).data.metrics
    return {
        key: sorted(tracker.metric_history(run_id, key))
        for key in sorted(keys)
        if not key.startswith(("timing/", "faults/"))
    }


def train_together(storage, cfgs, name: str):
    """The seeds `cfgs` in one Ray Train run named `name`: (its Result, its tracker, each seed's MLflow run)."""
    for cfg in cfgs:
        cfg.storage = launch.storage_uri(cfg.storage)
    uri = default_tracking_uri(str(storage))
    tracker = Tracker(uri, cfgs[0].logging.experiment)
    run_ids = [tracker.start_trial_run(cfg) for cfg in cfgs]
    result = launch.fit_trial(
        cfgs, resolve_model_path(cfgs[0].model, cfgs[0].cache_dir), name=name, tracking_uri=uri, run_ids=run_ids
    )
    for run_id in run_ids:
        tracker.finish(run_id, "finished")
    return result, tracker, run_ids


def same_as_alone(single: Tracker, tracker: Tracker, run_ids: list) -> None:
    runs = {r.data.params["seed"]: r.info.run_id for r in single.client.search_runs([single.experiment_id])}
    for seed, run_id in zip((0, 1), run_ids, strict=True):
        expected, got = histories(single, runs[str(seed)]), histories(tracker, run_id)
        assert got.keys() == expected.keys()
        differ = [key for key in expected if got[key] != expected[key]]
        assert not differ, f"seed {seed}: {differ[:5]}"


@pytest.fixture(scope="module")
def alone_runs(ray_cluster, tiny_model_path, tmp_path_factory):
    """Seeds 0 and 1 each trained alone as its own run, synchronous: (their folder, their final metrics)."""
    alone = tmp_path_factory.mktemp("alone")
    return alone, [train.run(seed_cfg(alone, seed)) for seed in (0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [0, 1], ids=["synchronous", "generation_overlapped"])
def test_two_seeds_in_one_run_reach_what_each_reaches_alone(ray_cluster, alone_runs, tmp_path, overlap):
    """Seeds 0 and 1 trained together (one worker group, one engine, the engine's weights switched between
    them) and each alone: every metric at every step equal, and the run's report each seed's own."""
    if overlap:
        alone = tmp_path / "alone"
        finals = [train.run(seed_cfg(alone, seed, f"rollout.overlap={overlap}")) for seed in (0, 1)]
    else:
        alone, finals = alone_runs
    together = tmp_path / "together"
    result, grouped, run_ids = train_together(
        together, [seed_cfg(together, seed, f"rollout.overlap={overlap}") for seed in (0, 1)], "both"
    )
    assert result.error is None
    single = Tracker(default_tracking_uri(str(alone)), "rlvr-explore")
    same_as_alone(single, grouped, run_ids)
    reports = seed_reports(dict(result.metrics))
    for report, final in zip(reports, finals, strict=True):
        assert report["val/accuracy"] == final["val/accuracy"]
        assert report["rollout/reward_mean"] == final["rollout/reward_mean"]
    assert result.metrics["val/accuracy"] == pytest.approx(sum(f["val/accuracy"] for f in finals) / 2)
    # The checkpoint holds each seed's part in a folder of its own.
    assert sorted(p.name for p in (together / "both").glob("checkpoint_*/seed_*")) == [
        "seed_0",
        "seed_0",
        "seed_1",
        "seed_1",
    ]  # keep: 2


@pytest.mark.slow
def test_a_run_on_a_kept_rollout_set_reaches_what_it_reaches_on_its_own(ray_cluster, alone_runs, tmp_path):
    """A sweep's pool keeps the engines and verifier from run to run (orchestrator/pool.py): a run given the
    set another run trained on (its engine left holding that run's last weights) logs, bit for bit, what
    it logs with engines of its own; the set started once and was kept, not started again."""
    import ray

    from orchestrator.pool import close_pool, start_pool

    kept = tmp_path / "kept"
    pool = start_pool()
    try:
        first, _, _ = train_together(kept, [seed_cfg(kept, 0)], "first")
        result, tracker, run_ids = train_together(kept, [seed_cfg(kept, 1)], "second")
        assert first.error is None and result.error is None
        assert ray.get(pool.sets_started.remote()) == 1
        assert not ray.get(pool.holds.remote("second"))  # released when its run ended
    finally:
        close_pool(pool)
    single = Tracker(default_tracking_uri(str(alone_runs[0])), "rlvr-explore")
    expected = {r.data.params["seed"]: r.info.run_id for r in single.client.search_runs([single.experiment_id])}
    want, got = histories(single, expected["1"]), histories(tracker, run_ids[0])
    assert got.keys() == want.keys()
    assert [key for key in want if got[key] != want[key]] == []
