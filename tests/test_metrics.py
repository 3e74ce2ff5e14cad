"""Metric names are documented once (trainables/metrics.py): what the code computes is there, and the
table of docs/metrics.md is generated from it. The sweep's real runs are held against it in
tests/test_sweep.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainables.data.arithmetic import make_splits
from trainables.data.offline import build_store, builtin_rows
from trainables.metrics import PLACEHOLDERS, documented, markdown
from trainables.rewards.verify import REASONS
from trainables.step_metrics import offline_metrics, step_metrics

PAGE = Path(__file__).parent.parent / "docs" / "metrics.md"


def undocumented(names) -> list[str]:
    return sorted(name for name in names if documented(name) is None)


def test_placeholders_stand_for_their_values_only():
    assert documented("rollout/verify_no_boxed") == "rollout/verify_<reason>"
    assert documented("rollout/verify_maybe") is None
    assert documented("timing/startup_learner") == "timing/startup_<stage>"
    assert documented("timing/nap") is None
    assert documented("val/aime24/maj_at_4") == "val/<benchmark>/<metric>"
    assert documented("val/aime24/maj_at_4/extra") is None
    assert documented("val/accuracy_base") == "<val>_base" and documented("policy/kl_base") is None
    assert documented("config/val/accuracy/ci_low") == "config/<objective>/<statistic>"
    assert set(PLACEHOLDERS["reason"]) == set(REASONS)


def test_what_a_step_computes_is_documented():
    sums = dict.fromkeys(
        [
            "seqs",
            "groups",
            "reward",
            "length",
            "stop",
            "zero_std",
            "tis_sum",
            "tis_capped",
            "tokens",
            "entropy_sum",
            "clipped_sum",
            "kl_sum",
            "offpolicy_sum",
            "pad_sum",
            "padded_sum",
            *(f"verify_{k}" for k in REASONS),
        ],
        1.0,
    )
    timings = dict.fromkeys(["generate", "score", "old_logprob", "offline", "update", "sync", "step"], 0.5)
    metrics = step_metrics(
        sums, 1.0, {"grad_norm": 1.0, "lr": 1e-6}, timings, step=0, optimizer_step=1, service_losses=0
    )
    offline = dict.fromkeys(
        [
            "replaced",
            "offline_correct",
            "no_offline_groups",
            "advantage_sum",
            "online_correct",
            "online",
            "oger_scored",
            "encoder_seconds",
            "oger_divergence",
            "oger_entropy",
            "oger_exploration",
        ],
        1.0,
    )
    metrics |= offline_metrics(offline, 0.5, embeddings=True)
    assert len(metrics) > 40 and undocumented(metrics) == []


def test_the_offline_stores_table_is_documented():
    problems, _ = make_splits(0, [1], train_size=8, val_size=0)
    rows = builtin_rows(problems, seed=0, teachers=("terse", "verbose"), wrong_rate=0.3, overlong_rate=0.3)
    store = build_store(rows, count_tokens=lambda text: len(text.split()), max_tokens=40)
    assert undocumented(store.metrics()) == []


def test_the_metrics_page_table_is_generated_from_the_code():
    text = PAGE.read_text()
    table = re.search(r"<!-- metrics: python -m trainables.metrics -->\n(.*?)<!-- /metrics -->", text, re.S)
    assert table is not None, "docs/metrics.md lost its <!-- metrics: python -m trainables.metrics --> block"
    assert table.group(1) == markdown(), (
        "docs/metrics.md's table is stale: replace the block with the output of `python -m trainables.metrics`"
    )


def test_the_validation_curve_draws_a_standard_error_as_its_metrics_band(monkeypatch):
    """A trial's validation_curve.png: val/accuracy a line with its 95% band from val/accuracy_se, never the
    standard error as a line on the accuracy axis; the CSV keeps every value."""
    import matplotlib.axes

    from trainables.runtime.artifacts import validation_curve

    lines, bands = [], []
    plot, fill = matplotlib.axes.Axes.plot, matplotlib.axes.Axes.fill_between
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", lambda ax, *a, **k: lines.append(k["label"]) or plot(ax, *a, **k))
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "fill_between",
        lambda ax, x, low, high, **k: bands.append((list(low), list(high))) or fill(ax, x, low, high, **k),
    )
    history = [
        (0, {"val/accuracy": 0.2, "val/accuracy_se": 0.01, "val/response_length": 20.0}),
        (10, {"val/accuracy": 0.4, "val/accuracy_se": 0.02, "val/response_length": 18.0}),
    ]
    csv, png = validation_curve(history, "trial")
    assert lines == ["accuracy", "response_length"]
    assert bands == [(pytest.approx([0.2 - 0.0196, 0.4 - 0.0392]), pytest.approx([0.2 + 0.0196, 0.4 + 0.0392]))]
    assert csv.splitlines()[0] == "step,val/accuracy,val/accuracy_se,val/response_length" and png[:4] == b"\x89PNG"
