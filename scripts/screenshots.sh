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
$PY -m mlflow ui --backend-store-uri "sqlite:///$STORAGE/mlflow.db" --host 127.0.0.1 --port "$MLFLOW_PORT" \
  >"$OUT/mlflow.log" 2>&1 &
MLFLOW_PID=$!
"$(dirname "$PY")/optuna-dashboard" "sqlite:///$STORAGE/$SWEEP/optuna.db" --host 127.0.0.1 --port "$OPTUNA_PORT" \
  >"$OUT/optuna.log" 2>&1 &
OPTUNA_PID=$!
trap 'kill $MLFLOW_PID $OPTUNA_PID 2>/dev/null' EXIT
for port in "$MLFLOW_PORT" "$OPTUNA_PORT"; do
  for _ in $(seq 60); do curl -sf "http://127.0.0.1:$port/" >/dev/null && break; sleep 1; done
done

read -r EXPERIMENT PARENT < <($PY - "$STORAGE" "$SWEEP" <<'PY'
import sys
from mlflow.tracking import MlflowClient
client = MlflowClient(f"sqlite:///{sys.argv[1]}/mlflow.db")
experiment = client.get_experiment_by_name("rlvr-explore").experiment_id
(parent, *_) = client.search_runs([experiment], f"tags.kind = 'sweep' and tags.sweep = '{sys.argv[2]}'")
print(experiment, parent.info.run_id)
PY
)
shot() {  # NAME URL
  chromium --headless=new --no-sandbox --disable-gpu --hide-scrollbars --window-size=1920,1200 \
    --virtual-time-budget=15000 --screenshot="$OUT/$1.png" "$2" >/dev/null 2>&1
  echo "$OUT/$1.png  <- $2"
}
# The sweep's seed runs side by side (the parent run would fold them under itself).
TRIALS="searchFilter=tags.sweep%20%3D%20%27$SWEEP%27%20and%20tags.kind%20%3D%20%27trial%27"
shot mlflow-runs "http://127.0.0.1:$MLFLOW_PORT/#/experiments/$EXPERIMENT/runs?$TRIALS"
shot mlflow-charts "http://127.0.0.1:$MLFLOW_PORT/#/experiments/$EXPERIMENT/runs?$TRIALS&compareRunsMode=CHART"
# The report as MLflow shows it: report.html, its plots inline, in the sweep's run's artifact view.
shot mlflow-report "http://127.0.0.1:$MLFLOW_PORT/#/experiments/$EXPERIMENT/runs/$PARENT/artifacts/report/report.html"
shot optuna-dashboard "http://127.0.0.1:$OPTUNA_PORT/dashboard/studies/1"
for png in "$STORAGE/$SWEEP"/report/*.png; do
  shot "report-$(basename "$png" .png)" "file://$png"
done
