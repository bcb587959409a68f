# session 51 call 2: generate()'s per-call cost profile (fixed for Prompt), dynamic and static cache
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
cd $R; D=/tmp/s51c2; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src
for c in dynamic static; do
DNNTUNE_CACHE_DIR=/tmp/c_gp timeout 200 python3 benchmarks/results/h100_2026-12-06_s51/call2/gen_profile.py cuda $c > $D/gen_profile_$c.txt 2>&1
head -3 $D/gen_profile_$c.txt; tar -czf $OUT/s51c2.tgz -C /tmp s51c2
done
