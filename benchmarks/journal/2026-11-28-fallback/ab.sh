# Deferred first conflicts (SFAAS_FALLBACK_AFTER): interleaved A/B, memonly, 10K keys,
# 2 workers, rounds every 5 s, 15 s a point. Sides: main at 2cccfd1 (a clone in $OLD, before
# the cross-worker fallback phase), this code with SFAAS_FALLBACK_AFTER=0 (every conflict in
# its epoch's fallback phase: main before this change) and this code's default (1).
#   OLD=/tmp/old2c REPEATS=3 OUT=/tmp/fb POINTS="uniform:12000 zipf:4000" bash ab.sh
set -u
export PATH=~/.cache/sfaas/venv/bin:$PATH
OLD=${OLD:-/tmp/old2c}; REPEATS=${REPEATS:-3}; OUT=${OUT:-/tmp/fb}
POINTS=${POINTS:-"uniform:12000 zipf:4000"}
NEW=$(cd "$(dirname "$0")/../../.." && pwd)
mkdir -p "$OUT"
for i in $(seq 1 "$REPEATS"); do
  for point in $POINTS; do
    dist=${point%%:*}; rate=${point##*:}
    for side in ${SIDES:-old after0 after1}; do
      dir=$NEW; unset SFAAS_FALLBACK_AFTER
      case $side in
        old) dir=$OLD ;;
        after0) export SFAAS_FALLBACK_AFTER=0 ;;
        after1) export SFAAS_FALLBACK_AFTER=1 ;;
      esac
      (cd "$dir" && PYTHONPATH=$dir timeout 300 python benchmarks/runtime/bench.py --store memonly \
        --keys 10000 --dist "$dist" --rates "$rate" --seconds 15 --snapshot-interval 5 \
        --label "fb-$side-$dist-$rate-$i" --out "$OUT/$side.jsonl" > "$OUT/$side-$dist-$rate-$i.log" 2>&1)
      echo "$side $dist $rate $i rc=$? $(tail -1 "$OUT/$side.jsonl" | cut -c1-160)"
    done
  done
done
unset SFAAS_FALLBACK_AFTER
