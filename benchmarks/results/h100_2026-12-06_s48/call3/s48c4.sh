# session 48 call 3: where generate()'s decode steps lose after optimize (decode_gpu.py), then the first true
# A/B of the output tails (A = HEAD with fuse_output_tails off, B = HEAD) on the LLaMA-style prefill, GPT-2 if time
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c4 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=/tmp/res4; mkdir -p $D /tmp/new /tmp/a
S=$R/.snap; tar -xf $S/s48new.tar -C /tmp/new; tar -xf $S/s48_notails.tar -C /tmp/a; R=/tmp/new; cd $R
export PYTHONPATH=/tmp/site
save() { rm -rf $D/*/logs $D/*/*/logs; tar -czf $OUT/r4.tgz -C /tmp res4; }
OUTF=$D/decode_gpu.json PYTHONPATH=/tmp/site:$R/src timeout 150 python3 $S/decode_gpu.py > $D/decode_gpu.txt 2>&1
grep -v "^\s*(" $D/decode_gpu.txt | tail -8; say decode; save
for m in llama_prefill gpt2; do
  left=$((500 - $(date +%s) + T0)); [ $left -lt 170 ] && break
  AB_FLAGS="--rounds 8 --model-timeout-s 80" timeout $left bash benchmarks/ab_trees.sh /tmp/a/src $R/src $D/ab $m > $D/ab_$m.txt 2>&1
  cat $D/ab/$m/summary.txt 2>/dev/null; tail -2 $D/ab_$m.txt; say "ab $m"; save
done
say done
