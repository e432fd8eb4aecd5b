#!/usr/bin/env bash
# The end-to-end benchmark on one GPU, one fresh process per model and method,
# each model's JSON written as soon as it is done, then gathered into one file:
#   bash benchmarks/run_gpu_e2e.sh OUTDIR [SECONDS_PER_MODEL]
set -u
out=${1:?OUTDIR}; per_model=${2:-150}
mkdir -p "$out/parts"
for m in eight_schools logistic_regression ill_conditioned_gaussian \
         hierarchical_logistic_regression logistic_regression_large stochastic_volatility; do
  timeout "$per_model" python3 benchmarks/end_to_end.py --models "$m" --first-only --no-cache \
    --num-warmup 500 --num-samples 16384 --block-size 4096 --nuts-num-samples 2000 \
    --out "$out/parts/$m.json" 2>&1 | tail -n 6
done
python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows = [json.loads(p.read_text()) for p in sorted((out / "parts").glob("*.json"))]
(out / "end_to_end_gpu.json").write_text(json.dumps(rows, indent=1))
print(f"{len(rows)} models gathered")
PY
