"""The pure parts of a configuration's seeds and of a trial's data order, on hand-made numbers: the
group's report at a step, the Tune trial's report of it, and which prompts each rank reads at each step."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from orchestrator.seeds import HORIZON_KEY, SE_KEY, SeedGroup, group_metrics, run_names, runs_at_once, runs_of
from trainables.config import TrialConfig
from trainables.rollout.feed import step_prompts
from trainables.runtime.seed_reports import group_report, seed_reports

T_975_1 = 12.706204736174707  # t quantile, 1 degree of freedom
Z_975 = 1.959963984540054


def test_group_metrics_two_seeds_by_hand():
    reports = [
        {"val/accuracy": 0.4, "loss": 1.0, "only_here": 3.0, "note": "a"},
        {"val/accuracy": 0.6, "loss": 3.0, "note": "b"},
    ]
    out = group_metrics(reports, "val/accuracy")
    half = T_975_1 * math.sqrt(0.02) / math.sqrt(2)  # sd of (0.4, 0.6) = sqrt(0.02)
    assert out == pytest.approx(
        {
            "val/accuracy": 0.5,
            "loss": 2.0,
            "val/accuracy/ci_low": 0.5 - half,
            "val/accuracy/ci_high": 0.5 + half,
            "seeds": 2,
            "seeds/0/val/accuracy": 0.4,
            "seeds/1/val/accuracy": 0.6,
        }
    )


def test_group_metrics_one_seed_takes_the_validation_error_and_drops_nan():
    out = group_metrics([{"val/accuracy": 0.5, SE_KEY: 0.02, "policy/kl": math.nan}], "val/accuracy")
    assert out["val/accuracy/ci_low"] == pytest.approx(0.5 - Z_975 * 0.02)
    assert out["val/accuracy/ci_high"] == pytest.approx(0.5 + Z_975 * 0.02)
    assert "policy/kl" not in out
    # A step without the objective (between validations) has no interval and no per-seed values.
    assert group_metrics([{"loss": 1.0}, {"loss": 2.0}], "val/accuracy") == {"loss": 1.5}


def test_the_controllers_callback_imports_no_part_of_the_trial():
    # Ray Train imports the callback's module in each run's controller: Ray alone, not the trial's stack.
    heavy = ["torch", "transformers", "deepspeed", "math_verify", "mlflow", "optuna"]
    code = f"import sys, orchestrator.relay; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert SeedGroup.run.__globals__["SeedReport"].__module__ == "orchestrator.relay"


def test_a_groups_report_holds_each_seeds_own_and_their_mean():
    """The run reports once for its seeds: the mean of what every seed reports as a number (Ray Train keeps
    checkpoints by it), every seed's report whole; one seed's report is its own, untouched."""
    reports = [
        {"val/accuracy": 0.4, "progress/step": 10, "only_here": 1.0, "note": "a"},
        {"val/accuracy": 0.6, "progress/step": 10, "note": "b"},
    ]
    report = group_report(reports)
    assert report["val/accuracy"] == pytest.approx(0.5) and report["progress/step"] == 10
    assert "only_here" not in report and "note" not in report
    assert seed_reports(report) == reports
    assert group_report(reports[:1]) is reports[0] and seed_reports(reports[0]) == [reports[0]]


def test_a_configurations_seeds_split_over_runs_of_contiguous_seeds_and_take_one_run_each_on_gpu_learners():
    cfgs = [TrialConfig(seed=s, name=f"c_seed{s}") for s in range(5)]

    def split(parts, use=cfgs):
        return [(name, [c.seed for c in seeds]) for name, seeds in runs_of("c", use, parts)]

    assert split(1) == [("c", [0, 1, 2, 3, 4])]  # the whole configuration in one run
    assert split(2) == [("c_seeds0-2", [0, 1, 2]), ("c_seeds3-4", [3, 4])]
    assert split(4) == [("c_seeds0-1", [0, 1]), ("c_seed2", [2]), ("c_seed3", [3]), ("c_seed4", [4])]
    assert split(9) == split(5) == [(f"c_seed{s}", [s]) for s in range(5)]  # a seed alone: its own run's name
    assert split(2, cfgs[:1]) == [("c_seed0", [0])]
    for parts in range(1, 6):  # the driver releases every name a split may give (a pruned run's sets)
        assert {name for name, _ in runs_of("c", cfgs, parts)} <= run_names("c", [c.seed for c in cfgs], parts)
    assert runs_at_once(cfgs[0], 5, 2) == 2 and runs_at_once(cfgs[0], 1, 2) == 1
    gpu = [cfg.model_copy(update={"learner": cfg.learner.model_copy(update={"use_gpu": True})}) for cfg in cfgs]
    assert [name for name, _ in runs_of("c", gpu[:3], 1)] == ["c_seed0", "c_seed1", "c_seed2"]
    assert runs_at_once(gpu[0], 3, 1) == 3


def group(seeds: int, runs: int) -> tuple[SeedGroup, list[dict]]:
    reported: list[dict] = []
    cfgs = [TrialConfig(seed=s, name=f"c_seed{s}") for s in range(seeds)]
    g = SeedGroup(runs_of("c", cfgs, runs), "val/accuracy", reported.append)
    g.history = [{} for _ in range(runs)]
    return g, reported


def test_a_step_is_reported_once_every_run_has_reached_it_with_the_seeds_interval():
    g, reported = group(3, 2)  # seeds 0 and 1 in one run, seed 2 in another (as split on GPUs)
    g.history[0] = {5: seed_reports(group_report([{"val/accuracy": 0.1}, {"val/accuracy": 0.3}]))}
    g._report_ready(done=[False, False])
    assert reported == []  # the second run has reported nothing yet
    g.history[1] = {5: [{"val/accuracy": 0.5}], 10: [{"val/accuracy": 0.6}]}
    g._report_ready(done=[False, False])
    g._report_ready(done=[False, False])  # nothing new: nothing reported twice
    assert [r["progress/step"] for r in reported] == [5]
    assert reported[0]["val/accuracy"] == pytest.approx(0.3) and reported[0]["seeds/2/val/accuracy"] == 0.5
    assert reported[0]["val/accuracy/ci_low"] < 0.1 and reported[0][HORIZON_KEY] == g.cfgs[0].learner.steps


def test_a_finished_run_stands_at_its_last_step():
    g, reported = group(2, 2)
    g.history[0] = {1: [{"val/accuracy": 0.1}], 2: [{"val/accuracy": 0.2}], 3: [{"val/accuracy": 0.3}]}
    g.history[1] = {1: [{"val/accuracy": 0.5}]}
    g._report_ready(done=[False, False])
    assert [r["progress/step"] for r in reported] == [1]  # run 1 is still running: step 2 waits
    g._report_ready(done=[False, True])  # run 1 ended at step 1 (pruned, or resumed finished)
    assert [r["progress/step"] for r in reported] == [1, 2, 3]
    assert reported[-1]["seeds/1/val/accuracy"] == 0.5 and reported[-1]["val/accuracy"] == pytest.approx(0.4)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_step_prompts_read_each_epoch_once_in_a_seeded_order(world):
    num_train, per_step, seed = 12, 4, 3
    steps_per_epoch = num_train // per_step
    epochs = []
    for epoch in range(3):
        seen = []
        for step in range(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch):
            ranks = [step_prompts(num_train, step, per_step, rank, world, seed) for rank in range(world)]
            assert all(len(r) == per_step // world for r in ranks)
            seen += [i for r in ranks for i in r]
        assert sorted(seen) == list(range(num_train))  # every prompt once per epoch, the ranks disjoint
        epochs.append(seen)
    assert epochs[0] != epochs[1]  # a new permutation each epoch
    # A function of (step, seed) alone: the same at a resumed step; another seed, another order.
    assert step_prompts(num_train, 4, per_step, 0, world, seed) == step_prompts(num_train, 4, per_step, 0, world, seed)
    assert [step_prompts(num_train, s, per_step, 0, 1, seed) for s in range(3)] != [
        step_prompts(num_train, s, per_step, 0, 1, seed + 1) for s in range(3)
    ]


def test_step_prompts_are_the_same_data_whatever_the_world_size():
    """Two ranks read at a step what one rank reads, split in two: the batch does not depend on the ranks."""
    one = step_prompts(40, 5, 8, 0, 1, 0)
    assert step_prompts(40, 5, 8, 0, 2, 0) + step_prompts(40, 5, 8, 1, 2, 0) == one
