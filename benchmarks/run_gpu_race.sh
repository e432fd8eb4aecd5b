#!/usr/bin/env bash
# The GPU benchmarks of the race and the paper's settings, one section per
# call (each well inside ten minutes), JSON under $OUT (or benchmarks/results).
#   bash benchmarks/run_gpu_race.sh paper   # benchmarks/paper.py, full size
#   bash benchmarks/run_gpu_race.sh dense   # dense_products.py: full DEER's
#                                           # products, elementwise or matrix
#   bash benchmarks/run_gpu_race.sh race    # eight schools: GPU samplers, and
#                                           # NUTS with a chain per CPU core
#   TARGETS="..." bash benchmarks/run_gpu_race.sh competitors  # every
#                                           # competitor but DEER, on TARGETS
#   bash benchmarks/run_gpu_race.sh deer    # the DEER rows on TARGETS
#   bash benchmarks/run_gpu_race.sh auto    # DEERHMC's default method="auto"
#                                           # and sequential HMC on the GPU,
#                                           # NUTS on the CPU cores, TARGETS
#   bash benchmarks/run_gpu_race.sh sweeps  # paper.py's banana by sweep
#   bash benchmarks/run_gpu_race.sh unroll  # paper.py's banana, its leapfrog
#                                           # steps written out and looped
#   bash benchmarks/run_gpu_race.sh irt     # item response theory by metric
#   TARGETS="..." bash benchmarks/run_gpu_race.sh metric  # DEERHMC's default
#                                           # metric ("auto": the Hessian up to
#                                           # num_chains * D**3 = 2**32) and
#                                           # the diagonal one, NUTS on the CPU
#   bash benchmarks/run_gpu_race.sh many    # many_chains.py: chain counts,
#                                           # stragglers, D=100 x 256 chains
#   bash benchmarks/run_gpu_race.sh one_call # first_run_phases.py --one-call:
#                                           # by method, and the sweep's compile
#   TARGETS="..." bash benchmarks/run_gpu_race.sh long  # 40-45 s budget
#                                           # a row (error 0.0001 on the
#                                           # larger targets), NUTS on the
#                                           # CPU cores and SAMPLERS on the GPU
#   bash benchmarks/run_gpu_race.sh hessian_phases  # first_run_phases.py
#                                           # --one-call: where 1,024 chains
#                                           # wait with the Hessian metric
#   bash benchmarks/run_gpu_race.sh jacobian  # jacobian_dim.py on the GPU
#   bash benchmarks/run_gpu_race.sh numpyro020  # NUTS x256 with NumPyro 0.20
#   bash benchmarks/run_gpu_race.sh phases  # first_run_phases.py, then the
#                                           # Gym's two targets: NUTS on the
#                                           # CPU cores, DEER rows in one call
# BlackJAX (ChEES, MEADS, adjusted MCLMC) and the Inference Gym must be
# importable (benchmarks/requirements-race.txt: where there is no network,
# carry those wheels, dm-tree, gast and decorator included); the image's JAX
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
dense)
    timeout 300 python3 benchmarks/dense_products.py --platform gpu --banana-steps 100000 --json "$out/dense_products_gpu.json"
    ;;
race)
    nproc
    timeout 150 python3 benchmarks/race.py --platform cpu --quick --targets eight_schools --samplers nuts_diag:16 --budget-seconds 15 --grace-seconds 40 --out "$out/race_cpu_nuts"
    timeout 420 python3 benchmarks/race.py --platform gpu --quick --targets eight_schools --samplers ${SAMPLERS:-deerhmc:256,1024 hmc_seq:256 deer:256 nuts_diag:256 chees:256} --budget-seconds 15 --grace-seconds 40 --out "$out/race_gpu"
    ;;
competitors)
    # every competitor but the DEER rows, on TARGETS (default: the Gym's)
    targets="${TARGETS:-gym_eight_schools gym_brownian_motion_missing_middle gym_synthetic_irt gym_ill_conditioned_gaussian}"
    budget="${BUDGET:-10}"
    timeout 240 python3 benchmarks/race.py --platform cpu --quick --targets $targets --samplers nuts_diag:16 --budget-seconds "$budget" --grace-seconds 30 --out "$out/race_cpu_nuts"
    timeout 600 python3 benchmarks/race.py --platform gpu --quick --targets $targets --samplers ${SAMPLERS:-nuts_diag:256 nuts_dense:256 chees:256 meads:256 adjusted_mclmc:256 hmc_seq:256} --budget-seconds "$budget" --grace-seconds 30 --out "$out/race_gpu_competitors"
    ;;
deer)
    # the DEER rows (and sequential HMC, their baseline) on TARGETS
    targets="${TARGETS:-gym_eight_schools gym_brownian_motion_missing_middle gym_synthetic_irt gym_ill_conditioned_gaussian}"
    timeout 580 python3 benchmarks/race.py --platform gpu --quick --targets $targets --samplers ${SAMPLERS:-deerhmc:256,1024 deer:256} --budget-seconds "${BUDGET:-10}" --grace-seconds 30 --out "$out/race_gpu_deer"
    ;;
auto)
    # what a user of DEERHMC(model) gets, against NUTS with a chain per core
    targets="${TARGETS:-gym_eight_schools gym_brownian_motion_missing_middle gym_synthetic_irt gym_ill_conditioned_gaussian}"
    timeout 120 python3 benchmarks/race.py --platform cpu --quick --targets $targets --samplers nuts_diag:16 --budget-seconds 10 --grace-seconds 30 --out "$out/race_cpu_nuts"
    timeout 330 python3 benchmarks/race.py --platform gpu --quick --targets $targets --samplers ${SAMPLERS:-deerhmc_auto:256,1024 hmc_seq:1024} --budget-seconds 10 --grace-seconds 30 --out "$out/race_gpu_auto"
    ;;
unroll)
    # DEERHMC writes a fixed count of at most 8 leapfrog steps out on a GPU;
    # the same banana rows with the loop kept, alternated
    i=0
    for looped in --looped-leapfrog "" --looped-leapfrog ""; do
        i=$((i + 1))
        timeout 140 python3 benchmarks/paper.py --platform gpu --size full --cases banana --variants deer_full --repeats 5 $looped --json "$out/paper_banana_unroll_$i${looped:+_looped}.json"
    done
    ;;
sweeps)
    # the sweep's cost per Newton iteration where a step is launch-bound
    timeout 100 python3 benchmarks/paper.py --platform gpu --size full --cases banana --variants deer_full --sweeps 8 0 16 --json "$out/paper_banana_sweeps_gpu.json"
    ;;
many)
    # sampling-phase throughput against chain count, stragglers set apart
    # (auto) and not (off); the D=100 logistic regression at 256 chains and
    # blocks of 4,096 (solved in groups of chains where it does not fit)
    timeout 240 python3 benchmarks/many_chains.py --models eight_schools --chains 1 256 1024 --block-sizes 1024 --warmup 200 --blocks 2 --stragglers auto --json "$out/many_chains_stragglers.json"
    timeout 120 python3 benchmarks/many_chains.py --models eight_schools --chains 1024 --block-sizes 1024 --warmup 200 --blocks 2 --stragglers off --json "$out/many_chains_stragglers_off.json"
    timeout 200 python3 benchmarks/many_chains.py --models logistic_regression_large --kernels mala --chains 256 --block-sizes 4096 --warmup 100 --blocks 1 --json "$out/many_chains_d100.json"
    ;;
irt)
    # item response theory (D = 501): the default (Hessian) metric and
    # NumPyro's diagonal one, 256 and 1,024 chains, 20 s of budget
    timeout 100 python3 benchmarks/race.py --platform cpu --quick --targets gym_synthetic_irt --samplers nuts_diag:16 --budget-seconds 20 --grace-seconds 30 --out "$out/race_cpu_nuts_irt"
    timeout 200 python3 benchmarks/race.py --platform gpu --quick --targets gym_synthetic_irt --samplers hmc_seq:256,1024 deerhmc_auto:1024 --budget-seconds 20 --grace-seconds 40 --out "$out/race_gpu_irt"
    timeout 200 python3 benchmarks/race.py --platform gpu --quick --deer-mass true --targets gym_synthetic_irt --samplers hmc_seq:256,1024 --budget-seconds 20 --grace-seconds 40 --out "$out/race_gpu_irt_diag"
    ;;
metric)
    # the default metric with many chains against the diagonal one (and NUTS
    # with a chain per CPU core), on TARGETS; about 9 minutes as it stands
    targets="${TARGETS:-gym_eight_schools gym_synthetic_irt gym_ill_conditioned_gaussian}"
    budget="${BUDGET:-12}"
    timeout 120 python3 benchmarks/race.py --platform cpu --quick --targets $targets --samplers nuts_diag:16 --budget-seconds "$budget" --grace-seconds 15 --out "$out/race_cpu_nuts_metric"
    timeout 220 python3 benchmarks/race.py --platform gpu --quick --targets $targets --samplers ${SAMPLERS:-deerhmc_auto:256,1024} --budget-seconds "$budget" --grace-seconds 15 --out "$out/race_gpu_auto_metric"
    timeout 220 python3 benchmarks/race.py --platform gpu --quick --deer-mass true --targets $targets --samplers ${SAMPLERS:-deerhmc_auto:256,1024} --budget-seconds "$budget" --grace-seconds 15 --out "$out/race_gpu_auto_diag"
    ;;
phases)
    # where a first call waits, then the race rows whose first segment holds
    # the warmup (numpyro_deer.MCMC rows) beside NUTS on the CPU cores
    timeout 170 python3 benchmarks/first_run_phases.py --platform gpu --chains 1 64 1024 --num-warmup 500 --json "$out/first_run_phases_gpu.json"
    targets="gym_eight_schools gym_brownian_motion_missing_middle"
    timeout 100 python3 benchmarks/race.py --platform cpu --quick --targets $targets --samplers nuts_diag:16 --budget-seconds 10 --grace-seconds 30 --out "$out/race_cpu_nuts"
    timeout 280 python3 benchmarks/race.py --platform gpu --quick --targets $targets --samplers ${SAMPLERS:-deerhmc:64 hmc_seq:1024 deerhmc_pw:64} --budget-seconds 10 --grace-seconds 30 --out "$out/race_gpu_phases"
    ;;
one_call)
    # where one mcmc.run of warmup and blocks waits (each compile's span), by
    # method; then the DEER block's compile with and without the sweep, by
    # chain count
    timeout 200 python3 benchmarks/first_run_phases.py --platform gpu --one-call --chains 1024 --methods sequential deer auto --num-warmup 500 --block-size 512 --blocks 2 --json "$out/first_run_one_call_gpu.json"
    timeout 200 python3 benchmarks/first_run_phases.py --platform gpu --one-call --chains 1 1024 --methods deer --sweeps 8 0 --num-warmup 500 --block-size 512 --blocks 2 --json "$out/first_run_sweep_gpu.json"
    ;;
long)
    # where nobody reached 0.0001 within 10-20 s: a longer budget decides
    # the second threshold (about 9 minutes for two targets as it stands)
    targets="${TARGETS:-gym_synthetic_irt hierarchical_logistic_regression}"
    timeout 170 python3 benchmarks/race.py --platform cpu --quick --targets $targets --samplers nuts_diag:16 --budget-seconds 45 --grace-seconds 15 --out "$out/race_cpu_nuts_long"
    timeout 400 python3 benchmarks/race.py --platform gpu --quick --targets $targets --samplers ${SAMPLERS:-deerhmc_auto:256,1024 chees:256} --budget-seconds 40 --grace-seconds 20 --out "$out/race_gpu_long"
    ;;
hessian_phases)
    # the timeline of a first call of 1,024 chains with the Hessian metric
    # and with NumPyro's diagonal one (the Hessian rows reach 0.01 later)
    timeout 500 python3 benchmarks/first_run_phases.py --platform gpu --one-call --models hierarchical_logistic_regression logistic_regression_large --chains 1024 --masses hessian true --num-warmup 500 --block-size 512 --blocks 2 --json "$out/first_run_hessian_gpu.json"
    ;;
jacobian)
    # the Jacobian strategies by dimension (whether jacobian="auto" should
    # take the full Jacobian above D = 2 on a GPU)
    timeout 500 python3 benchmarks/jacobian_dim.py --platform gpu --T 16384 --banana-T 100000 --json "$out/jacobian_dim_gpu.json"
    ;;
numpyro020)
    # NumPyro issue 2225: vectorized NUTS on the GPU with the image's NumPyro
    # and with 0.20.0 (carried as a wheel in .whl020)
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site020 .whl020/*.whl
    for site in "" /tmp/site020; do
        PYTHONPATH="${site:+$site:}$PYTHONPATH" python3 -c 'import numpyro; print("numpyro", numpyro.__version__)'
        PYTHONPATH="${site:+$site:}$PYTHONPATH" timeout 150 python3 benchmarks/race.py --platform gpu --quick --targets gym_eight_schools --samplers nuts_diag:256 --budget-seconds 10 --grace-seconds 30 --out "$out/race_numpyro${site:+020}"
    done
    ;;
esac
# the device returns few files: with $OUT set, keep each race's JSON
# (race_x/race.json -> race_x.json) and drop the figures
if [ -n "${OUT:-}" ]; then
    for d in "$out"/race*/; do
        if [ -f "$d/race.json" ]; then
            cp "$d/race.json" "${d%/}.json" && rm -rf "$d"
        fi
    done
fi
