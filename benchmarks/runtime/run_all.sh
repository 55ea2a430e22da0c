#!/usr/bin/env bash
# Reproduce benchmarks/runtime/RESULTS.md. Needs Kafka: `sfaas services up`.
# SECONDS_FIXED / SECONDS_SWEEP shorten or lengthen the runs (the issue asks for 60 s points).
# Each zipf point runs twice: with the fallback phase (default) and without (--no-fallback).
set -euo pipefail
cd "$(dirname "$0")/../.."
FIXED=${SECONDS_FIXED:-60}
SWEEP=${SECONDS_SWEEP:-15}
OUT=benchmarks/runtime/results.jsonl
: > "$OUT"
for store in memonly hybridlog appendlog lsm; do
  for keys in 10000 100000; do
    python benchmarks/runtime/bench.py --store $store --keys $keys --dist uniform --rates 1000 --seconds "$FIXED" --out "$OUT"
  done
  python benchmarks/runtime/bench.py --store $store --keys 100000 --dist zipf --rates 1000 --seconds "$FIXED" --out "$OUT"
  python benchmarks/runtime/bench.py --store $store --keys 100000 --dist zipf --rates 1000 --seconds "$FIXED" --out "$OUT" --no-fallback
  python benchmarks/runtime/bench.py --store $store --keys 10000 --dist uniform --sweep --seconds "$SWEEP" --out "$OUT" \
    --rates ${SWEEP_RATES:-1000,2000,3000,4000,5000,6000,8000,10000}
done
python benchmarks/runtime/report.py
