#!/usr/bin/env bash
# torch_e2e.py with each model in its own process, so a CUDA fault in one model (which poisons
# the process's CUDA context) cannot take the others' numbers with it. A model that fails is
# re-run without torch.compile, to tell a fault that needs max-autotune's CUDA graphs in the
# same process from one that does not. Writes $OUT/e2e_<model>.txt and $OUT/e2e_tables.txt.
set -uo pipefail
OUT=${OUT:-/tmp/e2e}
mkdir -p "$OUT"
cd "$(dirname "$0")"
for m in ${MODELS:-resnet_stack decoder_decode decoder_prefill}; do
  if ! timeout 200 python3 torch_e2e.py --dtype bf16 --also-throughput --also-refine --models "$m" \
      > "$OUT/e2e_$m.txt" 2>&1; then
    echo "== $m failed: $(grep -m1 -E 'Error|error:' "$OUT/e2e_$m.txt")" | tee -a "$OUT/e2e_tables.txt"
    timeout 150 python3 torch_e2e.py --dtype bf16 --skip-compile --models "$m" \
      > "$OUT/e2e_${m}_nocompile.txt" 2>&1
    echo "== $m without torch.compile: exit $?" | tee -a "$OUT/e2e_tables.txt"
    grep -A3 "^| model" "$OUT/e2e_${m}_nocompile.txt" | tee -a "$OUT/e2e_tables.txt"
    continue
  fi
  grep -A3 "^| model" "$OUT/e2e_$m.txt" | tee -a "$OUT/e2e_tables.txt"
done
