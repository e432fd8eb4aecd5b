#!/usr/bin/env bash
# The GPU benchmarks of the race and the paper's settings, one section per
# call (each well inside ten minutes), JSON under $OUT (or benchmarks/results).
#   bash benchmarks/run_gpu_race.sh paper   # benchmarks/paper.py, full size
#   bash benchmarks/run_gpu_race.sh race    # eight schools: GPU samplers, and
#                                           # NUTS with a chain per CPU core
# BlackJAX (ChEES, MEADS, adjusted MCLMC) must be importable; the image's JAX
# and NumPyro are used as they are.
set -uo pipefail
out="${OUT:-benchmarks/results}"
# cuSolver creates its handles outside XLA's pool: leave it memory
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}."
python3 -c 'import jax, numpyro; print("jax", jax.__version__, "numpyro", numpyro.__version__, jax.devices())'
case "${1:-paper}" in
paper)
    timeout 300 python3 benchmarks/paper.py --platform gpu --size full --cases banana --json "$out/paper_banana_gpu.json"
    timeout 200 python3 benchmarks/paper.py --platform gpu --size full --cases mala --json "$out/paper_mala_gpu.json"
    ;;
race)
    nproc
    timeout 150 python3 benchmarks/race.py --platform cpu --quick --targets eight_schools --samplers nuts_diag:16 --budget-seconds 15 --grace-seconds 40 --out "$out/race_cpu_nuts"
    timeout 420 python3 benchmarks/race.py --platform gpu --quick --targets eight_schools --samplers ${SAMPLERS:-deerhmc:256,1024 hmc_seq:256 deer:256 nuts_diag:256 chees:256} --budget-seconds 15 --grace-seconds 40 --out "$out/race_gpu"
    ;;
esac
