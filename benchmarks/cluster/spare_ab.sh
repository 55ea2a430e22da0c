#!/usr/bin/env bash
# Warm spares against cold restarts (launcher/spares.py): for each mode given (1: spares,
# 0: none), start a local bank cluster (2 workers, a round every second), SIGKILL worker 0
# three times 6 s apart, and print for each restart the time from the supervisor's
# "started worker 0" to the coordinator's "replaces lost worker", and each recovery's time.
#
#   ./run sfaas services up && source ~/.cache/sfaas/venv/bin/activate
#   bash benchmarks/cluster/spare_ab.sh 1 0      # then 0 1: alternate the order
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD"
PY="${PYTHON:-python}"
home="$("$PY" -c 'from sfaas.runtime.settings import Settings; print(Settings.load().home)')"
for mode in "$@"; do
  ns="spab$RANDOM"
  dir="$home/cluster/$ns"
  SFAAS_SUPERVISOR_SPARES="$mode" "$PY" -m sfaas up examples.bank:app --namespace "$ns" \
    --workers 2 --snapshot-interval 1 >/dev/null 2>&1
  sleep 6
  for _ in 1 2 3; do
    pid="$("$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print([p['pid'] for p in d['processes'] if p['role'] == 'worker' and p['index'] == 0][0])" "$dir/cluster.json")"
    kill -9 "$pid"
    sleep 6
  done
  "$PY" - "$dir" "$mode" <<'PY'
import datetime, re, sys
d, mode = sys.argv[1], sys.argv[2]
def ts(line): return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
starts = [l for l in open(f"{d}/supervisor.log") if "started worker 0" in l][1:]
joins = [l for l in open(f"{d}/coordinator.log") if "replaces lost worker" in l]
done = [re.search(r"done in ([\d.]+) s", l).group(1) for l in open(f"{d}/coordinator.log")
        if "done in" in l]
for s, c in zip(starts, joins):
    kind = "warm" if "warm spare" in s else "cold"
    print(f"spares={mode}: restart -> registered {ts(c) - ts(s):.2f} s ({kind})")
print(f"spares={mode}: recoveries (s): {done}")
PY
  "$PY" -m sfaas down --namespace "$ns" >/dev/null
done
