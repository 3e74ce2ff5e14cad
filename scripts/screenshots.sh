#!/usr/bin/env bash
# What a researcher sees of a finished sweep, as headless Chromium renders it: the MLflow UI's run
# table, chart view and report, the Optuna dashboard, and the report's plots. PNGs go to OUT; look at them.
#   scripts/screenshots.sh [STORAGE=runs] [SWEEP=ead] [OUT=screenshots]
# Needs Debian's chromium (apt-get install chromium) and the `ui` extra (installed here if missing).
set -euo pipefail
STORAGE=$(realpath "${1:-runs}"); SWEEP=${2:-ead}; OUT=$(realpath -m "${3:-screenshots}")
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT"
$PY -c "import optuna_dashboard" 2>/dev/null || $PY -m pip install -q -e ".[ui]"
[ -d "$STORAGE/$SWEEP/report" ] || $PY -m orchestrator.report "$STORAGE/$SWEEP"

free_port() { $PY -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
MLFLOW_PORT=$(free_port); OPTUNA_PORT=$(free_port)
$PY -m orchestrator.ui "$STORAGE" --port "$MLFLOW_PORT" \
  >"$OUT/mlflow.log" 2>&1 &
MLFLOW_PID=$!
"$(dirname "$PY")/optuna-dashboard" "sqlite:///$STORAGE/$SWEEP/optuna.db" --host 127.0.0.1 --port "$OPTUNA_PORT" \
  >"$OUT/optuna.log" 2>&1 &
OPTUNA_PID=$!
trap 'kill $MLFLOW_PID $OPTUNA_PID 2>/dev/null' EXIT
for port in "$MLFLOW_PORT" "$OPTUNA_PORT"; do
  for _ in $(seq 60); do curl -sf "http://127.0.0.1:$port/" >/dev/null && break; sleep 1; done
done

read -r EXPERIMENT PARENT TRIAL VIEW < <($PY - "$STORAGE" "$SWEEP" "$MLFLOW_PORT" <<'PY'
import sys
import yaml
from orchestrator.tracking import Tracker, tags_filter
storage, sweep, port = sys.argv[1:]
tracker = Tracker(f"sqlite:///{storage}/mlflow.db", "rlvr-explore")
(parent, *_) = tracker.client.search_runs([tracker.experiment_id], tags_filter(kind="sweep", sweep=sweep))
metric = yaml.safe_load(parent.data.params.get("search.metric", "null")) or "val/accuracy"
trials = tracker.client.search_runs([tracker.experiment_id], tags_filter(kind="trial", sweep=sweep, stage="select"))
trial = next((t for t in trials if t.data.tags.get("state") == "pruned"), trials[0])  # its page says why
searched = [k.removeprefix("best.") for k in parent.data.params if k.startswith("best.")]
print(tracker.experiment_id, parent.info.run_id, trial.info.run_id,
      tracker.trials_view(sweep, metric, searched, server=f"http://127.0.0.1:{port}"))
PY
)
shot() {  # NAME URL
  chromium --headless=new --no-sandbox --disable-gpu --hide-scrollbars --window-size=1920,1200 \
    --virtual-time-budget=15000 --screenshot="$OUT/$1.png" "$2" >/dev/null 2>&1
  echo "$OUT/$1.png  <- $2"
}
ML="http://127.0.0.1:$MLFLOW_PORT/#/experiments/$EXPERIMENT"
# The view the sweep's link opens (saved in the experiment): trial runs grouped by configuration, ranked.
shot mlflow-charts "$VIEW"
shot mlflow-runs "${VIEW/compareRunsMode=CHART/compareRunsMode=TABLE}"
shot mlflow-trial "$ML/runs/$TRIAL?workflowType=machine_learning"
# The report as MLflow shows it: report.html, its plots inline, in the sweep's run's artifact view.
shot mlflow-report "$ML/runs/$PARENT/artifacts/report/report.html?workflowType=machine_learning"
shot optuna-dashboard "http://127.0.0.1:$OPTUNA_PORT/dashboard/studies/1"
for png in "$STORAGE/$SWEEP"/report/*.png; do
  shot "report-$(basename "$png" .png)" "file://$png"
done
