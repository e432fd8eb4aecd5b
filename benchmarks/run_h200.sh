#!/usr/bin/env bash
# The H200 runs behind docs/performance.md and benchmarks/results/LOG.md, in stages that
# each fit in one 10-minute device call. Usage, from the repository root:
#
#     bash benchmarks/run_h200.sh STAGE OUTDIR
#
# STAGE: "ablation" (ablation + per-iteration cost), "suite-a" (three small
# models and the driver overhead), "suite-b" (the three larger models) or
# "suite-c" (what the last call of the session ran: suite-b with a shorter
# NUTS, and eight schools), "driver-stock-ablation-hard" (the driver's stock
# row; dense-Jacobian variants on the four hard models), "ablation-rest" (the
# remaining one-factor variants; eight schools' suite rows with the
# defaults), "basis" (the Hessian solve basis: ablation and suite rows),
# "final-a" / "final-b" (the suite on all six models with the defaults),
# "warm" / "warm-b" (block sizes after a stationary warmup; suite rows of
# the larger models), "windows" (the windowed solve on the hard models),
# "reference" (the sequential reference with data as arguments or
# constants), "hessian", "hessian-sv", "hessian-b" (the Hessian mass
# matrix), "dense" (the dense Jacobian with a TF32 scan), "auto" (the suite
# with the Hessian mass as the default), "sweep" / "sweep-b" / "sweep-c"
# (sequential segments from the front and the local fronts), "vectorized"
# (vectorized chains with and without the sweep), "blocks8" (eight blocks of
# 16,384 per model with the defaults and with sweep=0), "coupled" (the
# initial guess from coupled segments, n = 16, 32, 64, on every model; not yet
# run: no device was lent in the session that added it). OUTDIR receives the JSON files and logs. BlackJAX is used when
# importable (carry its wheel; see benchmarks/README.md).
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
ablation)
    run 330 ablation benchmarks/ablation.py --block-size 16384 --blocks 2 \
        --warmup 800 --variants baseline target=0.9 jacobian=full \
        full+target=0.9 --max-full-dim 96 --time-budget 300 \
        --json "$out/ablation_h200.json"
    run 170 iteration_cost benchmarks/iteration_cost.py --block-size 16384 \
        --max-full-dim 96 --json "$out/iteration_cost_h200.json"
    ;;
suite-a | suite-b)
    if [ "$stage" = suite-a ]; then
        models="eight_schools logistic_regression ill_conditioned_gaussian"
        long="--draws 16384 131072 1048576"
    else
        models="hierarchical_logistic_regression logistic_regression_large stochastic_volatility"
        long="--draws 16384 131072"
    fi
    if [ "$stage" = suite-a ]; then
        run 60 driver_overhead benchmarks/driver_overhead.py \
            --model logistic_regression --draws 131072 --block-size 16384 \
            --json "$out/driver_overhead_h200.json"
    fi
    for m in $models; do
        run 170 "suite_$m" benchmarks/suite.py --models "$m" $long \
            --max-seconds 150 --json "$out/suite_$m.json"
    done
    ;;
suite-c)
    # the three larger models, then eight schools again (after the change to
    # non-finite Newton rows); NUTS shortened to fit one call
    for m in hierarchical_logistic_regression logistic_regression_large \
        stochastic_volatility eight_schools; do
        run 112 "suite_$m" benchmarks/suite.py --models "$m" \
            --draws 16384 131072 --nuts-draws 500 --nuts-warmup 300 \
            --max-seconds 95 --json "$out/suite_$m.json"
    done
    ;;
driver-stock-ablation-hard)
    # the stock-MCMC row of the driver overhead (needs more than the 60 s it
    # had in suite-a), then the dense-Jacobian variants and the initial guess
    # on the four models the defaults do not converge on
    run 200 driver_overhead benchmarks/driver_overhead.py \
        --model logistic_regression --draws 131072 --block-size 16384 \
        --json "$out/driver_overhead_h200.json"
    run 360 ablation_hard benchmarks/ablation.py --block-size 16384 --blocks 2 \
        --warmup 800 --models eight_schools hierarchical_logistic_regression \
        stochastic_volatility ill_conditioned_gaussian \
        --variants jacobian=full full+clip=1 guess=previous full+damping=0.3 \
        window=B/32 --max-full-dim 256 --time-budget 330 \
        --json "$out/ablation_hard_h200.json"
    ;;
ablation-rest)
    # the one-factor variants not yet run on the H200, most important first
    # (variants are the outer loop, so the budget cuts the last ones); then
    # eight schools' suite rows with the package defaults (its earlier rows
    # used a dense-Jacobian rule since dropped), stock MCMC included
    run 230 ablation_rest benchmarks/ablation.py --block-size 16384 --blocks 2 \
        --warmup 800 --models eight_schools logistic_regression \
        ill_conditioned_gaussian hierarchical_logistic_regression \
        logistic_regression_large \
        --variants full+clip=1 guess=previous probes=2 gate=sigmoid\(1\) \
        damping=0.3 clip=none block=B/4 window=B/8 mass=dense \
        --max-full-dim 50 --time-budget 200 \
        --json "$out/ablation_rest_h200.json"
    run 140 suite_eight_schools benchmarks/suite.py --models eight_schools \
        --draws 16384 131072 1048576 --stock-max-draws 16384 \
        --nuts-draws 1000 --max-seconds 120 --json "$out/suite_eight_schools.json"
    ;;
basis)
    # the Hessian solve basis on every model (blocks after the first use the
    # previous block's draws), then the whitened baseline again (the SV
    # potential is cheaper now); then the suite with it on the Gaussian
    run 450 ablation_basis benchmarks/ablation.py --block-size 16384 --blocks 3 \
        --warmup 800 --variants basis=hessian hessian+block=B/4 baseline \
        --time-budget 420 --json "$out/ablation_basis_h200.json"
    run 110 suite_ill_conditioned_gaussian benchmarks/suite.py \
        --models ill_conditioned_gaussian --solve-basis hessian \
        --draws 16384 131072 --skip-stock --nuts-draws 500 --nuts-warmup 300 \
        --max-seconds 95 --json "$out/suite_ill_conditioned_gaussian.json"
    ;;
final-a | final-b)
    # one suite run per model with the package defaults (Hessian solve basis),
    # stock MCMC at T = 16,384; final-a the three models whose blocks converge
    # fast (T up to 1,048,576), final-b the three larger ones
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
warm)
    # the two models that need a long MALA warmup (BENCHMARK_MODELS'
    # num_warmup, 3,000 steps, now the scripts' default) at block sizes 2,048
    # to 16,384, and the D = 100 logistic regression likewise; then that
    # model's suite rows with blocks of at most 16,384
    run 300 ablation_warm benchmarks/ablation.py --block-size 16384 --blocks 2 \
        --models hierarchical_logistic_regression stochastic_volatility \
        logistic_regression_large --variants block=B/8 block=B/4 baseline \
        --time-budget 270 --json "$out/ablation_warm_h200.json"
    run 220 suite_logistic_regression_large benchmarks/suite.py \
        --models logistic_regression_large --draws 16384 131072 \
        --max-block-size 16384 --nuts-draws 500 --nuts-warmup 300 \
        --stock-max-draws 16384 --max-seconds 190 \
        --json "$out/suite_logistic_regression_large.json"
    ;;
warm-b)
    # smaller blocks for stochastic volatility; then the suite rows of the
    # two long-warmup models at the block size the "warm" stage found best
    # (hierarchical: 4,096) or the best measured so far (SV: 2,048)
    run 190 ablation_warm_sv benchmarks/ablation.py --block-size 16384 \
        --blocks 1 --models stochastic_volatility \
        --variants block=B/16 block=B/32 --time-budget 170 \
        --json "$out/ablation_warm_sv_h200.json"
    for m in hierarchical_logistic_regression:4096 stochastic_volatility:2048; do
        run 175 "suite_${m%:*}" benchmarks/suite.py --models "${m%:*}" \
            --draws 16384 131072 --max-block-size "${m#*:}" --nuts-draws 500 \
            --nuts-warmup 300 --stock-max-draws 16384 --max-seconds 150 \
            --json "$out/suite_${m%:*}.json"
    done
    ;;
windows)
    # the windowed solve (window advancing with the front, iteration cap
    # scaled with B / window) on the models whose full-block solve is slow;
    # then the large logistic regression's suite rows with the defaults
    run 330 ablation_window benchmarks/ablation.py --block-size 16384 \
        --blocks 3 --warmup 800 --models hierarchical_logistic_regression \
        stochastic_volatility eight_schools \
        --variants window=B/32+cap=32x window=B/8+cap=8x --time-budget 300 \
        --json "$out/ablation_window_h200.json"
    run 200 suite_logistic_regression_large benchmarks/suite.py \
        --models logistic_regression_large --draws 16384 131072 \
        --nuts-draws 500 --nuts-warmup 300 --stock-max-draws 16384 \
        --max-seconds 170 --json "$out/suite_logistic_regression_large.json"
    ;;
reference)
    # the sequential reference with the model's data as jit arguments and as
    # folded constants, in both solve bases; then the suite's rows of the two
    # models the defaults do not solve fast, at T = 16,384
    for how in args constants; do
        flag=""
        [ "$how" = constants ] && flag="--data-as-constants"
        run 130 "ablation_reference_$how" benchmarks/ablation.py \
            --block-size 16384 --blocks 1 --warmup 800 \
            --models logistic_regression_large logistic_regression \
            --variants sequential+basis=whitened basis=hessian $flag \
            --json "$out/ablation_reference_${how}_h200.json"
    done
    for m in hierarchical_logistic_regression stochastic_volatility; do
        run 110 "suite_$m" benchmarks/suite.py --models "$m" --draws 16384 \
            --nuts-draws 500 --nuts-warmup 300 --stock-max-draws 16384 \
            --max-seconds 90 --json "$out/suite_$m.json"
    done
    ;;
hessian)
    # the Hessian mass matrix (adapt_mass_matrix="hessian") against the
    # diagonal one on the two long-warmup models, 16,384 draws per row, in
    # their best blocks (hierarchical 4,096, SV 1,024) and in one block. Since
    # the Hessian mass is the default, "sequential" is its chain and the rows
    # of the diagonal one are "mass=diag", "sequential+mass=diag" (in the
    # committed JSON, from before: "baseline", "sequential" and
    # "sequential+mass=hessian")
    for spec in hierarchical_logistic_regression:4096:4 \
        stochastic_volatility:1024:16 hierarchical_logistic_regression:16384:1 \
        stochastic_volatility:16384:1; do
        IFS=: read -r m b n <<<"$spec"
        run 140 "ablation_hessian_${m}_$b" benchmarks/ablation.py \
            --block-size "$b" --blocks "$n" --models "$m" \
            --variants mass=diag sequential+mass=diag mass=hessian \
            --time-budget 120 --json "$out/ablation_hessian_${m}_${b}_h200.json"
    done
    ;;
hessian-sv)
    # the SV rows the "hessian" stage's time budget cut, then the suite rows
    # of the two long-warmup models with the Hessian mass (NUTS as in run6)
    for b in 1024:16 16384:1; do
        run 110 "ablation_hessian_sv_${b%:*}" benchmarks/ablation.py \
            --block-size "${b%:*}" --blocks "${b#*:}" \
            --models stochastic_volatility \
            --variants mass=hessian \
            --json "$out/ablation_hessian_sv_${b%:*}_h200.json"
    done
    for m in hierarchical_logistic_regression:4096 stochastic_volatility:1024; do
        run 150 "suite_${m%:*}" benchmarks/suite.py --models "${m%:*}" \
            --draws 16384 --max-block-size "${m#*:}" --hessian-mass \
            --nuts-draws 500 --nuts-warmup 300 --stock-max-draws 0 \
            --max-seconds 130 --json "$out/suite_${m%:*}_hessian.json"
    done
    ;;
hessian-b)
    # the four other models (B = 16,384, two blocks)
    run 560 ablation_hessian_rest benchmarks/ablation.py --block-size 16384 \
        --blocks 2 --models eight_schools logistic_regression \
        logistic_regression_large ill_conditioned_gaussian \
        --variants mass=diag sequential+mass=diag mass=hessian \
        --time-budget 520 --json "$out/ablation_hessian_rest_h200.json"
    ;;
auto)
    # the suite with adapt_mass_matrix="auto" (the Hessian mass up to D = 512)
    # on the three models whose blocks converge fast, T up to 131,072
    for m in eight_schools logistic_regression ill_conditioned_gaussian; do
        run 150 "suite_$m" benchmarks/suite.py --models "$m" \
            --draws 16384 131072 --stock-max-draws 0 --skip-blackjax \
            --max-seconds 125 --json "$out/suite_${m}_auto.json"
    done
    ;;
dense)
    # the clipped dense Jacobian, its scan in TF32 or float32, on the two
    # models whose diagonal solve misses 50 iterations (B = 16,384, one block)
    run 240 ablation_dense_hier benchmarks/ablation.py --block-size 16384 \
        --blocks 1 --models hierarchical_logistic_regression \
        --variants baseline full+tf32 full+highest mass=hessian+full+tf32 \
        --time-budget 220 --json "$out/ablation_dense_hier_h200.json"
    run 330 ablation_dense_sv benchmarks/ablation.py --block-size 16384 \
        --blocks 1 --models stochastic_volatility \
        --variants full+tf32 mass=hessian+full+tf32 mass=hessian \
        --time-budget 310 --json "$out/ablation_dense_sv_h200.json"
    ;;
sweep)
    # sequential segments of k steps from the front and the local fronts, on
    # the four models that converge fastest (B = 16,384, two blocks). The
    # first run of this stage and of sweep-b (ablation_sweep_h200.json,
    # ablation_sweep_b_h200.json) had 64 segments and variants sweep=8 16 32
    # (sweep-b: baseline sweep=16 sweep=64) = "sweep=k+segments=64" now.
    run 570 ablation_sweep2 benchmarks/ablation.py --block-size 16384 \
        --blocks 2 --models eight_schools logistic_regression \
        logistic_regression_large ill_conditioned_gaussian \
        --variants sweep=4 sweep=8 sweep=16 \
        --time-budget 540 --json "$out/ablation_sweep2_h200.json"
    ;;
sweep-b)
    # the same on the two models that miss 50 iterations without it
    run 570 ablation_sweep2_b benchmarks/ablation.py --block-size 16384 \
        --blocks 2 --models hierarchical_logistic_regression \
        stochastic_volatility --variants sweep=8 sweep=16 sweep=32 \
        --time-budget 540 --json "$out/ablation_sweep2_b_h200.json"
    ;;
sweep-c)
    # the sweep held back for the first 20 iterations of each block (its
    # segments now carry the gradient: one gradient evaluation per step)
    run 540 ablation_sweep3 benchmarks/ablation.py --block-size 16384 \
        --blocks 2 --variants sweep=16+after=20 sweep=8+after=20 \
        --time-budget 470 --json "$out/ablation_sweep3_h200.json"
    ;;
coupled)
    # coupled segments against the defaults, eight blocks of 16,384 per model:
    # Newton iterations, passes and the time per draw they cost together
    run 580 ablation_coupled benchmarks/ablation.py --block-size 16384 \
        --blocks 8 --variants baseline coupled=16 coupled=32 coupled=64 \
        --time-budget 500 --json "$out/ablation_coupled_h200.json"
    ;;
blocks8)
    # eight consecutive blocks of 16,384 on every model with the defaults
    # (and without the sweep): the distribution of Newton iterations per
    # block, and the speed-up over the sequential chain at T = 131,072
    run 580 ablation_blocks8 benchmarks/ablation.py --block-size 16384 \
        --blocks 8 --variants baseline sweep=0 --time-budget 500 \
        --json "$out/ablation_blocks8_h200.json"
    ;;
vectorized)
    # four chains solved together (chain_method="vectorized") with and
    # without the sweep, against one chain: a model whose blocks run the
    # sweep, one whose blocks converge before it starts, and the larger one
    run 400 vectorized_chains benchmarks/vectorized_chains.py --models \
        eight_schools logistic_regression hierarchical_logistic_regression \
        --chains 4 --block-size 16384 --blocks 2 --sweeps 0 8 \
        --json "$out/vectorized_chains_h200.json"
    ;;
*)
    echo "unknown stage $stage" >&2
    exit 2
    ;;
esac
