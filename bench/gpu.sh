#!/usr/bin/env bash
# Every GPU measurement in one run of at most 8 minutes, its results in three files in the output folder:
# summary.md (each step's exit code and time, then its tables), results.json (every step's JSON), gpu_results.tar.gz
# (all of it, with each step's log). For anyone with a CUDA GPU for a few minutes.
#
#   bash bench/gpu.sh [--dry-run] [--input TINY_SHAKESPEARE.txt] [--nanogpt NANOGPT_CHECKOUT] [OUT_DIR]
#
# The text: --input, else $TINY_SHAKESPEARE, else data/shakespeare_char/input.txt. nanoGPT (at 3adf61e, prepared as
# bench/README.md says): --nanogpt or $NANOGPT, else its step is skipped. OUT_DIR: else $OUT, else bench/results/gpu.
# --dry-run: every step on this CPU at a tiny size (Triton's interpreter; the tests only collected; no CUDA graphs,
# no compile), the same files, each step allowed three times its share (GPU_SH_BUDGET_S 1800 by default).
# The `step` lines below, in priority order so that a run cut short keeps the first ones, each run under `timeout`
# with its share of seconds (or what is left of GPU_SH_BUDGET_S, 480, less the report's 10 s, if that is less).
# First the paths that no GPU had run (tests/test_gpu_paths.py says which): their tests, then a few iterations of
# --norm=triton eager, with --cuda_graphs=True in float16 (the loss scaler), and compiled; then the demo.
# GPU_SH_STEPS="data,tests ...": run only those steps (the others are listed as not selected).
set -u
cd "$(dirname "$0")/.." || exit 1
DRY=0 INPUT=${TINY_SHAKESPEARE:-data/shakespeare_char/input.txt} NANOGPT=${NANOGPT:-} OUT_DIR=${OUT:-bench/results/gpu}
while (($#)); do
    case $1 in
        --dry-run) DRY=1 ;;
        --input) INPUT=$2 && shift ;;
        --nanogpt) NANOGPT=$2 && shift ;;
        -*) echo "bench/gpu.sh: unknown option '$1'; options: --dry-run, --input PATH, --nanogpt PATH" >&2 && exit 2 ;;
        *) OUT_DIR=$1 ;;
    esac
    shift
done
PY=${PY:-python3} BUDGET=${GPU_SH_BUDGET_S:-$((DRY ? 1800 : 480))} SCALE=$((DRY ? 3 : 1)) START=$(date +%s)
fail() { echo "bench/gpu.sh: $1" >&2 && exit 2; }
[[ -s $INPUT ]] || fail "no Tiny Shakespeare at '$INPUT': give its path with --input PATH (or TINY_SHAKESPEARE)"
[[ -z $NANOGPT || -f $NANOGPT/train.py ]] || fail "--nanogpt '$NANOGPT' is not a nanoGPT checkout (no train.py)"
mkdir -p "$OUT_DIR" 2>/dev/null && [[ -w $OUT_DIR ]] || fail "output folder '$OUT_DIR' is not writable"
"$PY" -c "import torch" 2>/dev/null || fail "'$PY' cannot import torch; set PY to the python that has it"
if ((DRY)); then
    export TRITON_INTERPRET=1
    DEV=cpu TINY=(--set n_layer=1 --set n_head=2 --set n_embd=32 --set block_size=16 --set batch_size=4)
    GRID=(--config configs/shakespeare_char_cpu.json "${TINY[@]}" --warmup 2 --iters 3 --eval_iters 1)
    FULL=("${GRID[@]}" --set max_iters=4 --set eval_interval=2 --set eval_iters=1 --set log_interval=1)
    NORMS=(--norms builtin,triton:eager) WIDE=(--norms builtin) DEMO=(--norms builtin --prompt_len 4 --new_tokens 4)
    TESTS=(--collect-only) DECODE=(--sizes configs/shakespeare_char_cpu.json --batches 1 --new_tokens 3 --repeats 1)
    MATMUL=(--widths 32) KERNELS=(--sizes 32 --rows 16 --reps 1) OVERHEAD=(--calls 10 --repeats 1)
    PROFILE=(--norms builtin) SMOKE=(--n_layer=1 --n_head=2 --n_embd=32 --block_size=16 --batch_size=4
        --max_iters=2 --eval_interval=2 --eval_iters=1)
    GRAPHS=() COMPILE=()
else
    "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || fail "no CUDA device here; try --dry-run"
    unset TRITON_INTERPRET  # the kernels must compile for the GPU
    DEV=cuda GRID=(--config configs/shakespeare_char.json --warmup 10 --iters 30 --eval_iters 5 --time_limit 80)
    FULL=(--config configs/shakespeare_char.json) NORMS=(--norms builtin,triton,custom:eager)
    WIDE=(--set n_layer=12 --set n_head=12 --set n_embd=768) PROFILE=(--norms builtin,triton)
    DEMO=() TESTS=() DECODE=() MATMUL=() KERNELS=() OVERHEAD=()
    SMOKE=(--max_iters=20 --eval_interval=20 --eval_iters=2) GRAPHS=(--cuda_graphs=True --dtype=float16)
    COMPILE=(--compile=True)
fi
OUT_DIR=$(cd "$OUT_DIR" && pwd) WORK=$(mktemp -d) && RES=$WORK/gpu_results && mkdir -p "$RES"
trap 'rm -rf "$WORK"' EXIT
rm -f "$OUT_DIR"/{summary.md,results.json,gpu_results.tar.gz}
export PYTHONUNBUFFERED=1

# step NAME SHARE COMMAND...: COMMAND under timeout (SIGINT, so that pytest and train.py still report), its output to
# the console and $RES/NAME.log, its exit code and seconds to $RES/steps.tsv.
step() {
    local name=$1 limit=$(($2 * SCALE)) t0=$SECONDS && shift 2
    if [[ -n ${GPU_SH_STEPS:-} && " ${GPU_SH_STEPS//,/ } " != *" $name "* ]]; then
        printf "%s\tskipped (not selected)\t0\t0\n" "$name" >>"$RES/steps.tsv" && return
    fi
    local left=$((BUDGET - 10 - $(date +%s) + START))
    ((left < limit)) && limit=$left
    if ((limit < 5)); then
        printf "%s\tskipped (budget spent)\t0\t0\n" "$name" >>"$RES/steps.tsv" && return
    fi
    echo "=== $name (at most ${limit} s; $(($(date +%s) - START)) of ${BUDGET} s spent): $*"
    timeout -s INT -k 10 "$limit" "$@" 2>&1 | tee "$RES/$name.log"
    printf "%s\t%s\t%s\t%s\n" "$name" "${PIPESTATUS[0]}" $((SECONDS - t0)) "$limit" >>"$RES/steps.tsv"
}
step data 10 "$PY" data/shakespeare_char/prepare.py --input "$INPUT" --out_dir "$WORK/data"
step tests 90 "$PY" -m pytest -q -p no:cacheprovider tests/test_gpu_paths.py \
    tests/test_{layernorm*,batch_invariant_triton}.py ${TESTS[@]+"${TESTS[@]}"}
SMOKE=(train.py configs/shakespeare_char.json --norm=triton --device=$DEV --data_dir="$WORK/data"
    --log_interval=5 --sample_at_end=False "${SMOKE[@]}")
step triton_eager 20 "$PY" "${SMOKE[@]}" --out_dir="$WORK/triton_eager"
step triton_graphs_float16 25 "$PY" "${SMOKE[@]}" ${GRAPHS[@]+"${GRAPHS[@]}"} --out_dir="$WORK/triton_graphs"
step triton_compile 60 "$PY" "${SMOKE[@]}" ${COMPILE[@]+"${COMPILE[@]}"} --out_dir="$WORK/triton_compile"
step demo_float32 25 "$PY" batch_independence.py --device=$DEV ${DEMO[@]+"${DEMO[@]}"}
step demo_bfloat16 25 "$PY" batch_independence.py --device=$DEV --dtype=bfloat16 ${DEMO[@]+"${DEMO[@]}"}
GRID+=(--data_dir "$WORK/data" --repeats 1 --modes eager,graphs,compile,reduce-overhead "${NORMS[@]}")
step grid_6x384 90 "$PY" -m bench.training "${GRID[@]}" --out "$RES/grid_6x384.json"
step grid_12x768 60 "$PY" -m bench.training "${GRID[@]}" "${WIDE[@]}" --out "$RES/grid_12x768.json"
step profile 20 "$PY" -m bench.training "${GRID[@]}" --profile "${PROFILE[@]}" --out "$RES/profile.json"
FASTEST=$("$PY" -c "import json, sys; s = json.load(open(sys.argv[1]))['sides']; print(min((v['ms_per_iter'], k)
    for k, v in s.items() if v['ms_per_iter'] and not k.startswith('custom'))[1])" "$RES/grid_6x384.json" 2>/dev/null)
read -r NORM MODE <<<"${FASTEST:-builtin eager}"
step full_run 90 "$PY" -m bench.training "${FULL[@]}" --curves --norms "$NORM" --modes "$MODE" --repeats 1 \
    --target_val 1.47 --data_dir "$WORK/data" --set max_wall_s=75 --verbose --out "$RES/full_run.json"
[[ -n $NANOGPT ]] && step nanogpt 90 "$PY" -m bench.training "${FULL[@]}" --curves --norms "" --nanogpt "$NANOGPT" \
    --repeats 1 --target_val 1.47 --time_limit 85 --verbose --out "$RES/nanogpt.json"
step decode 30 "$PY" -m bench.decoding --device $DEV --paths cached,mode ${DECODE[@]+"${DECODE[@]}"} \
    --out "$RES/decode.json"
step matmul 15 "$PY" -m bench.decoding --device $DEV --matmul ${MATMUL[@]+"${MATMUL[@]}"} --out "$RES/matmul.json"
step kernels 25 "$PY" -m bench.kernels --device $DEV ${KERNELS[@]+"${KERNELS[@]}"} --out "$RES/kernels.json"
step overhead 10 "$PY" -m bench.kernels --device $DEV --overhead ${OVERHEAD[@]+"${OVERHEAD[@]}"} \
    --out "$RES/overhead.json"

timeout 10 "$PY" -m bench.common "$RES" "$OUT_DIR" || tar czf "$OUT_DIR/gpu_results.tar.gz" -C "$WORK" gpu_results
echo "total $(($(date +%s) - START)) s; in $OUT_DIR:" && ls "$OUT_DIR"
