# Issue 34: interleaved A/B at 1,000 TPS (memonly, 10K uniform, rounds every 5 s, 20 s a point).
# Sides: main at 2cccfd1 (a clone in $OLD), this code with the client on asyncio and on uvloop,
# and this code with epochs gathered $G seconds and the client on uvloop.
#   OLD=/tmp/old2c G=0.003 REPEATS=3 OUT=/tmp/ab bash ab.sh
set -u
export PATH=~/.cache/sfaas/venv/bin:$PATH
OLD=${OLD:-/tmp/old2c}; G=${G:-0.003}; REPEATS=${REPEATS:-3}; OUT=${OUT:-/tmp/ab}
NEW=$(cd "$(dirname "$0")/../../.." && pwd)
mkdir -p "$OUT"
for i in $(seq 1 "$REPEATS"); do
  for side in ${SIDES:-old new uv gather}; do
    dir=$NEW; extra=""; unset SFAAS_EPOCH_GATHER
    case $side in
      old) dir=$OLD ;;
      uv) extra="--client-loop uvloop" ;;
      gather) extra="--client-loop uvloop"; export SFAAS_EPOCH_GATHER=$G ;;
    esac
    (cd "$dir" && PYTHONPATH=$dir timeout 300 python benchmarks/runtime/bench.py --store memonly \
      --keys 10000 --dist uniform --rates 1000 --seconds 20 --snapshot-interval 5 $extra \
      --label "ab-$side-$i" --out "$OUT/$side.jsonl" > "$OUT/$side-$i.log" 2>&1)
    echo "$side $i rc=$? $(tail -1 "$OUT/$side.jsonl" | cut -c1-120)"
  done
done
unset SFAAS_EPOCH_GATHER
