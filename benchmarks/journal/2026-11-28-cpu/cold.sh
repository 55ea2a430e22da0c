# Issue 34's cold point: 30 s at 1,000 TPS from a freshly started broker (and MinIO), main
# at 2cccfd1 (a clone in $OLD) against this code, interleaved; then the sweep of each.
#   OLD=/tmp/old2c REPEATS=3 OUT=/tmp/cold bash cold.sh
set -u
export PATH=~/.cache/sfaas/venv/bin:$PATH
OLD=${OLD:-/tmp/old2c}; REPEATS=${REPEATS:-3}; OUT=${OUT:-/tmp/cold}
NEW=$(cd "$(dirname "$0")/../../.." && pwd)
mkdir -p "$OUT"
services() { (cd "$NEW" && PYTHONPATH=. python -c "from launcher import main; import sys; sys.argv=['sfaas','services','$1']; main()" > /dev/null 2>&1); }
for i in $(seq 1 "$REPEATS"); do
  for side in old new; do
    dir=$NEW; [ $side = old ] && dir=$OLD
    services down; services up
    (cd "$dir" && PYTHONPATH=$dir timeout 300 python benchmarks/runtime/bench.py --store memonly \
      --keys 10000 --dist uniform --rates 1000 --seconds 30 --snapshot-interval 5 \
      --label "cold-$side-$i" --out "$OUT/cold-$side.jsonl" > "$OUT/cold-$side-$i.log" 2>&1)
    echo "cold $side $i rc=$? $(tail -1 "$OUT/cold-$side.jsonl" | cut -c1-150)"
  done
done
if [ "${SWEEP:-1}" = 1 ]; then
  for side in old new; do
    dir=$NEW; [ $side = old ] && dir=$OLD
    services down; services up
    (cd "$dir" && PYTHONPATH=$dir timeout 900 python benchmarks/runtime/bench.py --store memonly \
      --keys 10000 --dist uniform --sweep --rates 1000,2000,3000,4000,6000,8000,10000,12000 --seconds 15 \
      --snapshot-interval 5 --label "sweep-$side" --out "$OUT/sweep-$side.jsonl" > "$OUT/sweep-$side.log" 2>&1)
    echo "sweep $side rc=$?"
  done
fi
