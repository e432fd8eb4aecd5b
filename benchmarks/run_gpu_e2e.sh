#!/usr/bin/env bash
# The end-to-end benchmark on one GPU: one end_to_end.py invocation per model
# (each starts its own fresh processes), within a deadline for the whole run,
# each model's JSON written as soon as it is done, then gathered into one file.
#   bash benchmarks/run_gpu_e2e.sh OUTDIR DEADLINE_SECONDS [end_to_end.py options]
# e.g. bash benchmarks/run_gpu_e2e.sh out 540 --methods deer --no-cache
# MODELS (space-separated) overrides the six benchmark models.
set -u
out=${1:?OUTDIR}; deadline=${2:?DEADLINE_SECONDS}; shift 2
models=${MODELS:-"eight_schools logistic_regression ill_conditioned_gaussian hierarchical_logistic_regression logistic_regression_large stochastic_volatility"}
mkdir -p "$out/parts"
end=$((SECONDS + deadline))
for m in $models; do
  left=$((end - SECONDS))
  if [ "$left" -le 10 ]; then echo "deadline: $m not run"; continue; fi
  timeout "$left" python3 benchmarks/end_to_end.py --models "$m" \
    --num-warmup 500 --num-samples 16384 --block-size 4096 --nuts-num-samples 2000 \
    "$@" --out "$out/parts/$m.json" 2>&1 | tail -n 12
done
python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
parts = [json.loads(p.read_text()) for p in sorted((out / "parts").glob("*.json"))]
rows = [r for p in parts for r in p["rows"]]
machine = parts[0]["machine"] if parts else None
(out / "end_to_end_gpu.json").write_text(
    json.dumps({"machine": machine, "rows": rows}, indent=1)
)
print(f"{len(rows)} rows gathered")
PY
