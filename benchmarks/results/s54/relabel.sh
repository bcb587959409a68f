# session 54 (issue 25): HeuristicMode.B's labels timed again, three times, on the H200: the 46
# suite graphs, every engine's default plan ranked on call latency (as session 24's
# suite_latency, 77 s a run), one process per run, fresh caches each. Three runs give each
# problem three records: their agreement (benchmarks/heuristics/retest_agreement.py) is the
# labels' noise ceiling, and their geometric mean the labels.
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[relabel $(($(date +%s) - T0)) s] $*"; }
cd $R; export PYTHONPATH=/tmp/site:$R/src; D=/tmp/relabel; mkdir -p $D
save() { tar -czf $OUT/relabel.tgz -C /tmp relabel; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt; cat $D/gpu.txt
for k in ${RUNS:-1 2 3}; do
  left=$((580 - $(date +%s) + T0)); [ $left -lt 100 ] && { say "skip run $k"; continue; }
  timeout $left python3 benchmarks/run.py --ranking-metric latency --skip-compile --heuristic-b --modes warm \
    --budget-s $((left - 20)) --seed $k --out $D/lat$k > $D/lat$k.log 2>&1
  tail -2 $D/lat$k.log; say "run $k"; save
done
