# 1,000 TPS at 10K and at 50M keys (lsm, 2 workers, rounds every second, 20 s), alternating,
# each from the preload cache (written merged the first time: ~11 min for 50M keys).
#   OUT=/tmp/pairs.jsonl bash pairs.sh
set -u
export PATH=~/.cache/sfaas/venv/bin:$PATH
cd "$(dirname "$0")/../../.."
for k in 10000 50000000 10000 50000000; do
  python benchmarks/runtime/bench.py --store lsm --keys $k --preload --preload-cache ~/.cache/sfaas/preload \
    --seconds 20 --rates 1000 --out "${OUT:-/tmp/pairs.jsonl}" > /dev/null
done
