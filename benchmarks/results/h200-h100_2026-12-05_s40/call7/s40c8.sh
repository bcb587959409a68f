unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
cd $R; nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt
timeout 150 python3 benchmarks/replay_gap.py --models vit_b16 --rounds 4 --out $OUT/rg > $OUT/rg.log 2>&1; echo "rc=$?" >> $OUT/rg.log
tail -40 $OUT/rg.log
