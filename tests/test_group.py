"""A configuration's seeds in one Ray Train run (trainables/group.py): each seed's numbers are, bit for bit,
those it reaches trained alone as its own run; the run's report holds every seed's and their mean."""

from __future__ import annotations

import pytest

from orchestrator import evaluate, launch, train
from orchestrator.spec import load_trial_spec
from orchestrator.tracking import Tracker, default_tracking_uri
from trainables.data.models import resolve_model_path
from trainables.runtime.seed_reports import seed_reports

STEPS = 4


def seed_cfg(storage, seed: int, *extra: str):
    """The default spec's trial at `seed`, its problems at seed 0 (as a sweep's seeds are)."""
    return load_trial_spec("search_spaces/ead.yaml", [
        f"storage={storage}", f"name=s{seed}", f"seed={seed}", "task.seed=0", f"learner.steps={STEPS}",
        "validation.every=2", "validation.num_prompts=32", "checkpoint.every=2", *extra])


def histories(tracker: Tracker, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Every metric the run logged at every step, but wall-clock times."""
    keys = tracker.client.get_run(run_id).data.metrics
    return {key: tracker.metric_history(run_id, key) for key in sorted(keys) if not key.startswith("timing/")}


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [0, 1], ids=["synchronous", "generation_overlapped"])
def test_two_seeds_in_one_run_reach_what_each_reaches_alone(ray_cluster, tiny_model_path, tmp_path, overlap):
    """Seeds 0 and 1 trained together (one worker group, one engine, the engine's weights switched between
    them) and each alone: every metric at every step equal, and the run's report each seed's own."""
    alone, together = tmp_path / "alone", tmp_path / "together"
    finals = [train.run(seed_cfg(alone, seed, f"rollout.overlap={overlap}")) for seed in (0, 1)]
    cfgs = [seed_cfg(together, seed, f"rollout.overlap={overlap}") for seed in (0, 1)]
    for cfg in cfgs:
        cfg.storage = launch.storage_uri(cfg.storage)
    uri = default_tracking_uri(str(together))
    grouped = Tracker(uri, cfgs[0].logging.experiment)
    run_ids = [grouped.start_trial_run(cfg) for cfg in cfgs]
    result = launch.fit_trial(cfgs, resolve_model_path(cfgs[0].model, cfgs[0].cache_dir), name="both",
                              tracking_uri=uri, run_ids=run_ids)
    assert result.error is None
    for run_id in run_ids:
        grouped.finish(run_id, "finished")

    single = Tracker(default_tracking_uri(str(alone)), cfgs[0].logging.experiment)
    runs = {r.data.params["seed"]: r.info.run_id for r in single.client.search_runs([single.experiment_id])}
    for seed, run_id in zip((0, 1), run_ids, strict=True):
        expected, got = histories(single, runs[str(seed)]), histories(grouped, run_id)
        assert got.keys() == expected.keys()
        differ = [key for key in expected if got[key] != expected[key]]
        assert not differ, f"seed {seed}: {differ[:5]}"
    reports = seed_reports(dict(result.metrics))
    for report, final in zip(reports, finals, strict=True):
        assert report["val/accuracy"] == final["val/accuracy"]
        assert report["rollout/reward_mean"] == final["rollout/reward_mean"]
    assert result.metrics["val/accuracy"] == pytest.approx(sum(f["val/accuracy"] for f in finals) / 2)
    # The checkpoint holds each seed's part in a folder of its own; evaluate takes the seed it is asked for.
    assert sorted(p.name for p in (together / "both").glob("checkpoint_*/seed_*")) == ["seed_0", "seed_0", "seed_1", "seed_1"]
    if overlap == 0:
        assert evaluate.main([str(together / "both"), "--limit", "4", "--samples", "1", "--seed-index", "1",
                              "--out", str(tmp_path / "eval.json")]) == 0
        assert [p.name.split("-")[-1] for p in (together / "both" / "export").iterdir()] == ["seed_1"]
        assert evaluate.main([str(together / "both"), "--seed-index", "2"]) == 2  # two seeds: no third
