"""A configuration's report to Ray Train, with every seed's own inside it (`trainables/group.py` writes it,
the sweep's Tune trial reads it back: `orchestrator/seeds.py`). Plain dictionaries: no heavy import."""

from __future__ import annotations

BY_SEED = "by_seed"  # a group's report holds seed r's own report under by_seed/<r>/


def group_report(reports: list[dict[str, float]]) -> dict[str, float]:
    """One report for R seeds: the mean over seeds of every number each reports, and each seed's own
    report under `by_seed/<r>/` (`seed_reports` takes them apart). One seed: its report as it is."""
    if len(reports) == 1:
        return reports[0]
    shared = set.intersection(*(set(r) for r in reports))
    mean = {
        k: sum(float(r[k]) for r in reports) / len(reports)
        for k in sorted(shared)
        if all(isinstance(r[k], (int, float)) for r in reports)
    }
    return {**mean, **{f"{BY_SEED}/{i}/{k}": v for i, r in enumerate(reports) for k, v in r.items()}}


def seed_reports(report: dict[str, float]) -> list[dict[str, float]]:
    """The seeds' own reports in a group's report (`group_report`), in seed order."""
    seeds: dict[int, dict[str, float]] = {}
    for key, value in report.items():
        if key.startswith(f"{BY_SEED}/"):
            _, index, name = key.split("/", 2)
            seeds.setdefault(int(index), {})[name] = value
    return [seeds[i] for i in sorted(seeds)] if seeds else [report]
