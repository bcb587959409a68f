# session 52 call 3 (never ran: no machine could be started):
# where a static-cache decode step's time goes (dnntune's replay against PyTorch's forward
# replayed by dnntune's graphs and transformers' own compile, with cProfile); generate.py
# --cache static with policy heuristic
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[s52c3 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=/tmp/s52c3; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src
save() { tar -czf $OUT/s52c3.tgz -C /tmp s52c3; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt
DNNTUNE_CACHE_DIR=/tmp/c_r timeout 70 python3 benchmarks/results/h100_2026-12-06_s52/static_reuse.py > $D/reuse.log 2>&1
grep "\[reuse\]" $D/reuse.log || tail -20 $D/reuse.log; say reuse; save
FORMS=transformers_compile,dnntune_replay,pytorch_graph PROFILE=dnntune_replay,pytorch_graph ROUNDS=5 \
  DNNTUNE_CACHE_DIR=/tmp/c_p timeout 150 python3 benchmarks/results/h100_2026-12-06_s52/static_vs_compile.py \
  > $D/probe2.log 2>&1; grep "\[static_vs_compile\]" $D/probe2.log || tail -30 $D/probe2.log; say probe2; save
DNNTUNE_CACHE_DIR=/tmp/c_gh timeout 80 python3 benchmarks/generate.py --new-tokens 64 --prompt 128 \
    --rounds 4 --cache static --policy heuristic --out $D/gen_static_heur > $D/gen_static_heur.log 2>&1
grep "\[generate\]" $D/gen_static_heur.log || tail -20 $D/gen_static_heur.log; say "generate static heuristic"; save
