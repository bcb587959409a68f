unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c4 $(($(date +%s) - T0)) s] $*"; }
cd $R
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt
DNNTUNE_CACHE_DIR=/tmp/c4 timeout 200 python3 .snap/vitdiag.py > $OUT/vitdiag.txt 2>&1; echo "rc=$?" >> $OUT/vitdiag.txt
say diag; grep -v "Warning\|warn" $OUT/vitdiag.txt | tail -60
