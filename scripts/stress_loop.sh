#!/usr/bin/env bash
# Run the state-store stress tests N times (default 200), each with a fresh seed; stop at
# the first failure (an assertion, or the watchdog ending a hung run) and print its seed
# and log. Ends with a one-line summary "N passed, M failed".
#
#   scripts/stress_loop.sh [N] [extra pytest args...]
#
# Environment: PYTHON (default: the sfaas venv's python, else python3),
# SFAAS_STRESS_ROUNDS / SFAAS_STRESS_WATCHDOG (passed on), STRESS_LOG_DIR (where the logs
# go; default: a new temporary directory). Run from the repository root, or anywhere:
# the script works in the checkout it belongs to (PYTHONPATH points there).
set -u

runs=${1:-200}
shift $(( $# > 0 ? 1 : 0 ))
case $runs in '' | *[!0-9]*) echo "usage: $0 [N] [pytest args...]" >&2; exit 2 ;; esac

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-$HOME/.cache/sfaas/venv/bin/python}
[ -x "$python" ] || python=python3
logs=${STRESS_LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/sfaas-stress.XXXXXX")}
mkdir -p "$logs"

passed=0
failed=0
start=$(date +%s)
for ((i = 1; i <= runs; i++)); do
    seed=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
    log="$logs/run-$i-seed-$seed.log"
    t0=$(date +%s)
    (
        cd "$root" &&
            SFAAS_STRESS_SEED=$seed PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" \
                "$python" -m pytest tests/statestores/test_stress.py -q -p no:cacheprovider "$@"
    ) >"$log" 2>&1
    rc=$?
    secs=$(($(date +%s) - t0))
    if [ "$rc" -eq 0 ]; then
        passed=$((passed + 1))
        printf 'run %d/%d: seed %s passed (%d s)\n' "$i" "$runs" "$seed" "$secs"
        rm -f "$log"
        continue
    fi
    failed=$((failed + 1))
    what="failed (exit $rc)"
    grep -q 'stress watchdog' "$log" && what="HUNG: the watchdog fired (exit $rc)"
    printf 'run %d/%d: seed %s %s after %d s\n' "$i" "$runs" "$seed" "$what" "$secs"
    printf -- '----- log of run %d (seed %s, %s) -----\n' "$i" "$seed" "$log"
    cat "$log"
    printf -- '----- end of log; rerun: SFAAS_STRESS_SEED=%s %s -m pytest tests/statestores/test_stress.py -----\n' \
        "$seed" "$python"
    break
done
echo "$passed passed, $failed failed ($(($(date +%s) - start)) s; logs in $logs)"
[ "$failed" -eq 0 ]
