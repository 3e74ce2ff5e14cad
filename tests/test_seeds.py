"""The pure parts of a configuration's seeds and of a trial's data order, on hand-made numbers: the
group's report at a step, the Tune trial's report of it, and which prompts each rank reads at each step."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from orchestrator.seeds import HORIZON_KEY, SE_KEY, SeedGroup, group_metrics
from trainables.runtime.seed_reports import group_report, seed_reports
from trainables.config import TrialConfig
from trainables.trial import step_prompts

T_975_1 = 12.706204736174707  # t quantile, 1 degree of freedom
Z_975 = 1.959963984540054


def test_group_metrics_two_seeds_by_hand():
    reports = [{"val/accuracy": 0.4, "loss": 1.0, "only_here": 3.0, "note": "a"},
               {"val/accuracy": 0.6, "loss": 3.0, "note": "b"}]
    out = group_metrics(reports, "val/accuracy")
    half = T_975_1 * math.sqrt(0.02) / math.sqrt(2)  # sd of (0.4, 0.6) = sqrt(0.02)
    assert out == pytest.approx({"val/accuracy": 0.5, "loss": 2.0, "val/accuracy/ci_low": 0.5 - half,
                                 "val/accuracy/ci_high": 0.5 + half, "seeds": 2,
                                 "seeds/0/val/accuracy": 0.4, "seeds/1/val/accuracy": 0.6})


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
    reports = [{"val/accuracy": 0.4, "progress/step": 10, "only_here": 1.0, "note": "a"},
               {"val/accuracy": 0.6, "progress/step": 10, "note": "b"}]
    report = group_report(reports)
    assert report["val/accuracy"] == pytest.approx(0.5) and report["progress/step"] == 10
    assert "only_here" not in report and "note" not in report
    assert seed_reports(report) == reports
    assert group_report(reports[:1]) is reports[0] and seed_reports(reports[0]) == [reports[0]]


def test_the_tune_trial_reports_a_step_once_with_the_seeds_interval():
    reported: list[dict] = []
    cfgs = [TrialConfig(seed=s, name=f"c_seed{s}") for s in range(2)]
    g = SeedGroup(cfgs, "val/accuracy", reported.append, name="c")
    assert g.name == "c" and SeedGroup(cfgs[:1], "val/accuracy", reported.append, name="c").name == "c_seed0"
    at = [group_report([{"val/accuracy": a, "progress/step": step}, {"val/accuracy": b, "progress/step": step}])
          for step, a, b in ((5, 0.1, 0.3), (10, 0.2, 0.4))]
    for report in (at[0], at[1], at[1]):  # the last one again, as a resumed finished run reports it
        g._report(report)
    assert [r["progress/step"] for r in reported] == [5, 10]
    assert reported[1]["val/accuracy"] == pytest.approx(0.3) and reported[1]["seeds/1/val/accuracy"] == 0.4
    assert reported[1]["val/accuracy/ci_low"] < 0.2 and reported[1][HORIZON_KEY] == cfgs[0].learner.steps


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
    assert ([step_prompts(num_train, s, per_step, 0, 1, seed) for s in range(3)]
            != [step_prompts(num_train, s, per_step, 0, 1, seed + 1) for s in range(3)])


def test_step_prompts_are_the_same_data_whatever_the_world_size():
    """Two ranks read at a step what one rank reads, split in two: the batch does not depend on the ranks."""
    one = step_prompts(40, 5, 8, 0, 1, 0)
    assert step_prompts(40, 5, 8, 0, 2, 0) + step_prompts(40, 5, 8, 1, 2, 0) == one
