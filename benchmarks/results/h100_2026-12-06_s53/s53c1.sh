# session 53, first device call: session 52's next/s53c1.sh (the static-cache move-in's GPU tests,
# a generate() loop's recordings and generate.py --cache static, each without and with the
# move-in), then session 52's unrun probe (where a static decode step's time goes, cProfile),
# then generate.py with the default DynamicCache (which race chose dnntune's route). Run from the repo root:
#   export R=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#     .whl/*.whl 2>/dev/null; export PYTHONUNBUFFERED=1; bash benchmarks/results/h100_2026-12-06_s53/s53c1.sh
export OUT_FIRST=$OUT
bash benchmarks/results/h100_2026-12-06_s52/next/s53c1.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[s53c1b $(($(date +%s) - T0)) s] $*"; }
cd $R; D=/tmp/s53c1b; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src
save() { tar -czf $OUT/s53c1b.tgz -C /tmp s53c1b; }
S=benchmarks/results/h100_2026-12-06_s52
FORMS=transformers_compile,dnntune_replay,pytorch_graph PROFILE=dnntune_replay,pytorch_graph ROUNDS=4 NEW=48 \
  DNNTUNE_STATIC_CACHE_MOVE_IN=1 DNNTUNE_CACHE_DIR=/tmp/c_p timeout 130 python3 $S/static_vs_compile.py \
  > $D/probe2.log 2>&1; grep "\[static_vs_compile\]" $D/probe2.log || tail -30 $D/probe2.log; say probe2; save
DNNTUNE_CACHE_DIR=/tmp/c_gd timeout 90 python3 benchmarks/generate.py --prompt 128 --rounds 4 --new-tokens 48 \
  --policy heuristic --out $D/gen_dynamic > $D/gen_dynamic.log 2>&1
grep "\[generate\]" $D/gen_dynamic.log || tail -20 $D/gen_dynamic.log; say "generate dynamic"; save
