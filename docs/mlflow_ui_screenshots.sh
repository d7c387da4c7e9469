#!/usr/bin/env bash
# Screenshots of the MLflow UI pages a user reads after a sweep and `bcrit analyze` (docs/mlflow.md).
# Not part of CI: needs chromium (apt-get install chromium) and a finished, analysed sweep directory.
#   docs/mlflow_ui_screenshots.sh runs/tiny /tmp/mlflow-shots
set -euo pipefail
SWEEP=$(cd "${1:-runs/tiny}" && pwd)
OUT=${2:-/tmp/mlflow-shots}
PORT=${PORT:-5055}
VENV=${VENV:-.venv}
CHROMIUM=${CHROMIUM:-chromium}
mkdir -p "$OUT"

"$VENV/bin/mlflow" server --backend-store-uri "sqlite:///$SWEEP/mlflow.db" --host 127.0.0.1 --port "$PORT" \
  --workers 1 >"$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done

# the experiment and the parent run recorded in the sweep directory
read -r EXP PARENT < <("$VENV/bin/python" -c "import json,sys; d=json.load(open(sys.argv[1])); \
print(d['experiment_id'], d['run_id'])" "$SWEEP/mlflow_parent.json")
BASE="http://127.0.0.1:$PORT/#/experiments/$EXP"
shot() {  # name, url, height
  "$CHROMIUM" --headless=new --no-sandbox --disable-gpu --hide-scrollbars --window-size="1800,${3:-1000}" \
    --virtual-time-budget=60000 --screenshot="$OUT/$1.png" "$2" 2>/dev/null
}
# 1. children sorted by the numeric batch_size metric (a string param would give 128, 16, 32, 4, 64, 8)
shot runs "$BASE/runs?workflowType=machine_learning&searchFilter=tags.%60mlflow.parentRunId%60%20%3D%20%27$PARENT%27&orderByKey=metrics.%60batch_size%60&orderByAsc=true"
# 2. the parent run: description (the report's head) and the B_crit metrics per target
shot parent "$BASE/runs/$PARENT?workflowType=machine_learning" 1400
# 3. the report in the artifact viewer, plots embedded
shot report "$BASE/runs/$PARENT/artifacts/analysis/report.html?workflowType=machine_learning" 1200
# 4. the headline table (log_table), flags included
shot table "$BASE/runs/$PARENT/artifacts/analysis/headline.json?workflowType=machine_learning" 1000
ls -l "$OUT"/*.png
