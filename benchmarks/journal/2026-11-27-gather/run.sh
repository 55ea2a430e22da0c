set -u
export PATH=~/.cache/sfaas/venv/bin:$PATH
# interleaved: main 2cccfd1, this code, this code with epochs gathered (SFAAS_EPOCH_GATHER)
G=${G:-0.004}
for i in 1 2 3; do
  for side in old new gather; do
    if [ $side = old ]; then dir=/tmp/old2c; else dir=/work/main; fi
    if [ $side = gather ]; then export SFAAS_EPOCH_GATHER=$G; else unset SFAAS_EPOCH_GATHER; fi
    (cd $dir && PYTHONPATH=$dir timeout 300 python benchmarks/runtime/bench.py --store memonly --keys 10000 --dist uniform --rates 1000 --seconds 20 --snapshot-interval 5 --label ab34-$side-$i --out /tmp/ab34/$side.jsonl > /tmp/ab34/$side-$i.log 2>&1)
    echo "$side $i rc=$?"
  done
done
unset SFAAS_EPOCH_GATHER
echo done
