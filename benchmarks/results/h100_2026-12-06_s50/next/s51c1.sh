# written in session 50 for the next session's first device call (about 500 s): where generate()'s
# per-call cost goes, the uncaptured example's recheck (5ccf99a) on three models, generate() with a
# DynamicCache and with a StaticCache. Run from the repo root:
#   export R=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#     .whl/*.whl 2>/dev/null; export PYTHONUNBUFFERED=1; bash benchmarks/results/h100_2026-12-06_s50/next/s51c1.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[s51c1 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=/tmp/s51c1; mkdir -p $D
export PYTHONPATH=/tmp/site:$R/src
save() { rm -rf $D/*/logs; tar -czf $OUT/s51c1.tgz -C /tmp s51c1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt
DNNTUNE_CACHE_DIR=/tmp/c_gp timeout 150 python3 benchmarks/results/h100_2026-12-06_s50/call4/gen_profile.py cuda \
  > $D/gen_profile.txt 2>&1
grep "generate()" $D/gen_profile.txt; say gen_profile; save
for m in convnext_tiny bert_base vit_b16; do
  left=$((420 - $(date +%s) + T0)); [ $left -lt 60 ] && break
  DNNTUNE_CACHE_DIR=/tmp/c_$m timeout $left python3 benchmarks/models.py --models $m --variants eager,dnntune \
    --skip-compile --tune-budget-s 15 --rounds 8 --out $D/$m > $D/$m.log 2>&1
  grep "\[models\]" $D/$m.log; say $m; save
done
for cache in dynamic static; do
  left=$((570 - $(date +%s) + T0)); [ $left -lt 60 ] && break
  DNNTUNE_CACHE_DIR=/tmp/c_g$cache timeout $left python3 benchmarks/generate.py --new-tokens 64 --prompt 128 \
    --rounds 6 --without-race --cache $cache --out $D/gen_$cache > $D/gen_$cache.log 2>&1
  grep "\[generate\]" $D/gen_$cache.log; say "generate $cache"; save
done
say done
