#!/usr/bin/env bash
# The H200 runs behind docs/performance.md, in stages that each fit in one
# 10-minute device call. Usage, from the repository root:
#
#     bash benchmarks/run_h200.sh STAGE OUTDIR
#
# STAGE: "final-a" / "final-b" (the suite on the three models whose blocks
# converge fast, up to T = 1,048,576 / on the three larger ones), "blocks8"
# (eight blocks of 16,384 per model with the defaults and without the sweep),
# "blocks8-b" (stochastic volatility and the Gaussian with sweep=16),
# "vectorized" (four chains solved together, with and without the sweep),
# "cost" (the cost of one Newton iteration and the driver's overhead).
# OUTDIR receives the JSON files and logs. The history of the stages run so
# far is in benchmarks/results/LOG.md. BlackJAX is used when importable.
set -uo pipefail
stage=$1
out=$2
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=".:${PYTHONPATH:-}"
py=python3

run() {  # run SECONDS NAME ARGS...: one script under a time limit, logged
    local limit=$1 name=$2
    shift 2
    timeout "$limit" $py "$@" 2>&1 | tee "$out/$name.log"
}

case $stage in
final-a | final-b)
    if [ "$stage" = final-a ]; then
        models="eight_schools logistic_regression ill_conditioned_gaussian"
        long="--draws 16384 131072 1048576"
        limit=175
    else
        models="logistic_regression_large hierarchical_logistic_regression stochastic_volatility"
        long="--draws 16384 131072 --nuts-draws 500 --nuts-warmup 300"
        limit=180
    fi
    for m in $models; do
        run $limit "suite_$m" benchmarks/suite.py --models "$m" $long \
            --stock-max-draws 16384 --max-seconds $((limit - 25)) \
            --json "$out/suite_$m.json"
    done
    ;;
blocks8)
    run 580 ablation_blocks8 benchmarks/ablation.py --block-size 16384 \
        --blocks 8 --variants baseline sweep=0 --time-budget 500 \
        --json "$out/ablation_blocks8_h200.json"
    ;;
blocks8-b)
    run 450 ablation_blocks8_b benchmarks/ablation.py --block-size 16384 \
        --blocks 8 --models stochastic_volatility ill_conditioned_gaussian \
        --variants baseline sweep=16+after=20 --time-budget 400 \
        --json "$out/ablation_blocks8_b_h200.json"
    ;;
vectorized)
    run 400 vectorized_chains benchmarks/vectorized_chains.py --models \
        eight_schools logistic_regression hierarchical_logistic_regression \
        --chains 4 --block-size 16384 --blocks 2 --sweeps 0 8 \
        --json "$out/vectorized_chains_h200.json"
    ;;
cost)
    run 200 driver_overhead benchmarks/driver_overhead.py \
        --model logistic_regression --draws 131072 --block-size 16384 \
        --json "$out/driver_overhead_h200.json"
    run 300 iteration_cost benchmarks/iteration_cost.py --block-size 16384 \
        --max-full-dim 96 --json "$out/iteration_cost_h200.json"
    ;;
*)
    echo "unknown stage $stage" >&2
    exit 2
    ;;
esac
