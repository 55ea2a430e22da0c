set -u
export PATH=~/.cache/sfaas/venv/bin:$PATH
for i in 1 2 3; do
  for side in old new; do
    if [ $side = old ]; then dir=/tmp/old; else dir=/work/main; fi
    (cd $dir && PYTHONPATH=$dir timeout 300 python benchmarks/runtime/bench.py --store memonly --keys 10000 --dist uniform --rates 1000 --seconds 20 --label ab-$side --out /tmp/ab/$side.jsonl > /tmp/ab/$side-$i.log 2>&1)
    echo "$side $i rc=$?"
  done
done
echo done
