"""The MLflow UI's view of one sweep, opened by the link the sweep prints: its trial runs grouped by
configuration and stage (mean line and band per group), the objective's chart first, the table's columns the
objective, the searched parameters and the run's configuration, seed, stage and state, every run drawn.

MLflow (3.17) keeps a shared view as an experiment tag `mlflow.sharedViewState.<key>` holding the
page's state, and opens it at `#/experiments/<id>/runs?viewStateShareKey=<key>`; the chart or table
mode is a URL parameter of its own. The state's fields are those the UI itself writes when a view is
saved (its frontend: `useSharedExperimentViewState.ts`, `ExperimentPageUIState.tsx`,
`ExperimentPageSearchFacetsState.tsx`, `runs-charts.types.ts`); nothing here is a public API, so a
view the UI cannot read falls back to the runs page, and the link still lists the runs.
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.parse

TAG_PREFIX = "mlflow.sharedViewState."
TAG_VALUE_LIMIT = 20_000  # MLflow's longest experiment tag value
FIRST_SECTION = "sweep-first"
COLUMN_TAGS = ("config", "seed", "stage", "state")
WIDTHS = {"metrics": 120, "params": 160, "tags": 80}  # pixels: the table fits a 1920-pixel window


def column(kind: str, key: str) -> str:
    """The UI's name of a table column (and of a sort key): metrics.`val/accuracy`."""
    return f"{kind}.`{key}`"


def line_chart(metric: str, uuid: str) -> dict:
    """A line chart of `metric` against the step, in the first section."""
    return {
        "uuid": uuid,
        "type": "LINE",
        "runsCountToCompare": 10,
        "metricSectionId": FIRST_SECTION,
        "deleted": False,
        "isGenerated": False,
        "metricKey": metric,
        "selectedMetricKeys": [metric],
        "lineSmoothness": 0,
        "xAxisKey": "step",
        "selectedXAxisMetricKey": "",
        "xAxisScaleType": "linear",
        "scaleType": "linear",
        "range": {},
        "yAxisKey": "metric",
        "yAxisExpressions": [],
        "ignoreOutliers": False,
        "useGlobalXaxisKey": True,
        "useGlobalLineSmoothing": True,
    }


def section_of(metric: str) -> str:
    """The section the UI files a metric's chart under: its prefix."""
    return metric.rpartition("/")[0] or "Model metrics"


def sweep_view(metric: str, charts: list[str], logged: list[str], params: list[str], search_filter: str) -> dict:
    """The page's state: `charts` (the objective first) in an open first section, every other section of
    the `logged` metrics folded after it; runs matching `search_filter`, grouped by their configuration,
    ranked by `metric`."""
    first = list(dict.fromkeys([metric, *charts]))
    folded = sorted({section_of(m) for m in logged}) + ["System metrics"]
    columns = [
        column("metrics", metric),
        *(column("params", p) for p in params),
        *(column("tags", t) for t in COLUMN_TAGS),
    ]
    return {
        "searchFilter": search_filter,
        "orderByKey": column("metrics", metric),
        "orderByAsc": False,
        "startTime": "ALL",
        "lifecycleFilter": "Active",
        "modelVersionFilter": "All Runs",
        "datasetsFilter": [],
        "selectedColumns": columns,
        "columnOrder": columns,
        "columnWidths": {c: WIDTHS[c.split(".", 1)[0]] for c in columns},
        "runsHiddenMode": "SHOW_ALL",  # the UI draws only the first 10 runs otherwise
        "compareRunCharts": [line_chart(m, f"sweep-chart-{i}") for i, m in enumerate(first)],
        "compareRunSections": [
            {"uuid": FIRST_SECTION, "name": "the sweep", "display": True, "isReordered": True},
            *(
                {"uuid": f"folded-{name}", "name": name, "display": False, "isReordered": False}
                for name in dict.fromkeys(folded)
            ),
        ],
        "isAccordionReordered": True,  # the sections in this order, not by name
        # By configuration and stage: no group's mean mixes the seeds that selected a configuration with the
        # fresh seeds that confirm it.
        "groupBy": {
            "aggregateFunction": "average",
            "groupByKeys": [{"mode": "tag", "groupByData": "config"}, {"mode": "tag", "groupByData": "stage"}],
        },
        "groupsExpanded": {},
        "useGroupedValuesInCharts": True,
        "hideEmptyCharts": True,
        "viewMaximized": False,
        "runListHidden": False,
        "chartsSearchFilter": "",
        "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0, "selectedXAxisMetricKey": ""},
    }


def saved_view(state: dict, name: str) -> tuple[str, str]:
    """(tag name, tag value) of the state saved as a view named `name` (also listed in the page's views)."""
    text = json.dumps(state, separators=(",", ":"), sort_keys=True)
    key = hashlib.sha256(text.encode()).hexdigest()[:24]
    now = int(time.time() * 1000)
    value = json.dumps({"name": name, "createdAt": now, "updatedAt": now, "state": text}, separators=(",", ":"))
    if len(value) > TAG_VALUE_LIMIT:
        raise ValueError(f"the view's state is {len(value)} characters; MLflow keeps {TAG_VALUE_LIMIT}")
    return TAG_PREFIX + key, value


def view_link(server: str, experiment_id: str, tag: str) -> str:
    query = urllib.parse.urlencode({"viewStateShareKey": tag.removeprefix(TAG_PREFIX), "compareRunsMode": "CHART"})
    return f"{server}/#/experiments/{experiment_id}/runs?{query}"
