#!/usr/bin/env bash
# Every GPU measurement in one run of at most 7 minutes by its own clock (bench/README.md says what each step does).
#
#   bash bench/gpu.sh [--dry-run] [--input TINY_SHAKESPEARE.txt] [--nanogpt NANOGPT_CHECKOUT] [OUT_DIR]
#
# PY: the python that has torch (default python3). SHARES: each step's seconds of the 420-s budget, in the order the
# steps run. GPU_SH_BUDGET_S scales every share (default 420 s, 1260 s with --dry-run); GPU_SH_STEPS="data,tests ...":
# run only those steps (the others: not selected).
set -u
cd "$(dirname "$0")/.." || exit 1
fail() { echo "bench/gpu.sh: $1" >&2 && exit 2; }
DRY=0 INPUT=${TINY_SHAKESPEARE:-data/shakespeare_char/input.txt} NANOGPT=${NANOGPT:-} OUT_DIR=${OUT:-bench/results/gpu}
while (($#)); do
    case $1 in
        --dry-run) DRY=1 ;;
        --input) INPUT=$2 && shift ;;
        --nanogpt) NANOGPT=$2 && shift ;;
        -*) fail "unknown option '$1'; options: --dry-run, --input PATH, --nanogpt PATH" ;;
        *) OUT_DIR=$1 ;;
    esac
    shift
done
if [[ -n $NANOGPT ]]; then WIDE_S=0 NANO_S=30; else WIDE_S=30 NANO_S=0; fi
SHARES=(report:10 data:5 tests:40 triton_eager:15 triton_graphs_float16:15 triton_compile:45 resume_graphs:25
    demo_float32:15 demo_bfloat16:15 grid_6x384:75 profile:15 decode:20 matmul:10 full_run:50
    grid_12x768:$WIDE_S nanogpt:$NANO_S kernels:20 overhead:15)
PY=${PY:-python3} BUDGET=${GPU_SH_BUDGET_S:-$((DRY ? 1260 : 420))} START=$(date +%s)
share() {  # share NAME: its seconds of BUDGET
    local item && for item in "${SHARES[@]}"; do
        [[ ${item%%:*} == "$1" ]] && echo $((${item#*:} * BUDGET / 420)) && return
    done
}
[[ -s $INPUT ]] || fail "no Tiny Shakespeare at '$INPUT': give its path with --input PATH (or TINY_SHAKESPEARE)"
[[ -z $NANOGPT || -f $NANOGPT/train.py ]] || fail "--nanogpt '$NANOGPT' is not a nanoGPT checkout (no train.py)"
mkdir -p "$OUT_DIR" 2>/dev/null && [[ -w $OUT_DIR ]] || fail "output folder '$OUT_DIR' is not writable"
OUT_DIR=$(cd "$OUT_DIR" && pwd) WORK=$(mktemp -d) && RES=$WORK/gpu_results && mkdir -p "$RES"
trap 'rm -rf "$WORK"' EXIT
"$PY" -c "import json; from bench.common import machine_info; print(json.dumps(machine_info()))" \
    >"$RES/machine.json" 2>/dev/null || fail "'$PY' cannot import torch; set PY to the python that has it"
if ((DRY)); then
    export TRITON_INTERPRET=1
    DEV=cpu TINY=(--set n_layer=1 --set n_head=2 --set n_embd=32 --set block_size=16 --set batch_size=4)
    GRID=(--config configs/shakespeare_char_cpu.json "${TINY[@]}" --warmup 2 --iters 3 --eval_iters 1)
    FULL=("${GRID[@]}" --set max_iters=4 --set eval_interval=2 --set eval_iters=1 --set log_interval=1)
    NORMS=(--norms builtin,triton:eager) WIDE=(--norms builtin) DEMO=(--norms builtin --prompt_len 4 --new_tokens 4)
    TESTS=(--collect-only) DECODE=(--sizes configs/shakespeare_char_cpu.json --batches 1 --new_tokens 3 --repeats 1)
    MATMUL=(--widths 32) KERNELS=(--sizes 32 --rows 16 --reps 1) OVERHEAD=(--calls 10 --repeats 1)
    PROFILE=(--config configs/shakespeare_char_cpu.json "${TINY[@]}" --norms builtin) GRAPHS=() COMPILE=()
    SMOKE=(--n_layer=1 --n_head=2 --n_embd=32 --block_size=16 --batch_size=4 --max_iters=2 --eval_interval=2
        --eval_iters=1) RESUME=(--config configs/shakespeare_char_cpu.json "${TINY[@]}" --set eval_iters=1)
else
    "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || fail "no CUDA device here; try --dry-run"
    unset TRITON_INTERPRET  # the kernels must compile for the GPU
    DEV=cuda GRID=(--config configs/shakespeare_char.json --warmup 10 --iters 30 --eval_iters 5 --time_limit 60)
    FULL=(--config configs/shakespeare_char.json) NORMS=(--norms builtin,triton,custom:eager)
    WIDE=(--set n_layer=12 --set n_head=12 --set n_embd=768 --norms builtin,triton --modes eager,graphs)
    PROFILE=(--config configs/shakespeare_char.json --norms builtin,triton) COMPILE=(--compile=True)
    DEMO=() TESTS=() DECODE=() MATMUL=() KERNELS=() OVERHEAD=()
    SMOKE=(--max_iters=20 --eval_interval=20 --eval_iters=2) GRAPHS=(--cuda_graphs=True --dtype=float16)
    RESUME=(--config configs/shakespeare_char.json --set cuda_graphs=True --set dtype=float32 --set eval_iters=2
        --rtol 1e-4)  # float32: a GPU's atomic additions still differ in the last bits, run to run
fi
# One Inductor and Triton cache for the whole run: a later step loads what an earlier one compiled.
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=$WORK/inductor_cache TRITON_CACHE_DIR=$WORK/triton_cache
rm -f "$OUT_DIR"/{summary.md,results.json,gpu_results.tar.gz}
SUM=0 PLAN="" && for item in "${SHARES[@]}"; do
    SUM=$((SUM + $(share "${item%%:*}"))) PLAN+="${item%%:*} $(share "${item%%:*}"), "
done
echo "Budget $BUDGET s; each step's share in s: ${PLAN%, }; sum $SUM s." | tee "$RES/plan.txt"
: >"$RES/steps.tsv"
pack() {  # the three files from what is done so far
    timeout 20 "$PY" -m bench.common "$RES" "$OUT_DIR" || tar czf "$OUT_DIR/gpu_results.tar.gz" -C "$WORK" gpu_results
}
pack

# step NAME COMMAND...: COMMAND under timeout (SIGINT, so that pytest and train.py still report), its output to the
# console and $RES/NAME.log, its exit code and seconds to $RES/steps.tsv; then the three files again.
step() {
    local name=$1 limit && limit=$(share "$1") && shift
    local left=$((BUDGET - $(share report) / 2 - $(date +%s) + START)) t0=$SECONDS why=""
    ((left < limit)) && limit=$left
    ((limit < 5)) && why="budget spent" && [[ " ${SHARES[*]} " == *" $name:0 "* ]] && why="no share"
    [[ -n ${GPU_SH_STEPS:-} && " ${GPU_SH_STEPS//,/ } " != *" $name "* ]] && why="not selected"
    [[ -n $why ]] && printf "%s\tskipped (%s)\t0\t0\n" "$name" "$why" >>"$RES/steps.tsv" && return
    echo "=== $name (at most ${limit} s; $(($(date +%s) - START)) of ${BUDGET} s spent): $*"
    timeout -s INT -k 5 "$limit" "$@" 2>&1 | tee "$RES/$name.log"
    printf "%s\t%s\t%s\t%s\n" "$name" "${PIPESTATUS[0]}" $((SECONDS - t0)) "$limit" >>"$RES/steps.tsv"
    pack
}
step data "$PY" data/shakespeare_char/prepare.py --input "$INPUT" --out_dir "$WORK/data"
step tests "$PY" -m pytest -q -p no:cacheprovider tests/test_gpu_paths.py tests/test_batch_invariant_triton.py \
    tests/test_layernorm_triton.py ${TESTS[@]+"${TESTS[@]}"}
SMOKE=(train.py configs/shakespeare_char.json --norm=triton --device=$DEV --data_dir="$WORK/data"
    --log_interval=5 --sample_at_end=False "${SMOKE[@]}")
step triton_eager "$PY" "${SMOKE[@]}" --out_dir="$WORK/triton_eager"
step triton_graphs_float16 "$PY" "${SMOKE[@]}" ${GRAPHS[@]+"${GRAPHS[@]}"} --out_dir="$WORK/triton_graphs"
step triton_compile "$PY" "${SMOKE[@]}" ${COMPILE[@]+"${COMPILE[@]}"} --out_dir="$WORK/triton_compile"
step resume_graphs "$PY" -m bench.resume "${RESUME[@]}" --set dropout=0.2 --device $DEV \
    --set data_dir="$WORK/data" --out "$RES/resume_graphs.json"
step demo_float32 "$PY" batch_independence.py --device=$DEV ${DEMO[@]+"${DEMO[@]}"}
step demo_bfloat16 "$PY" batch_independence.py --device=$DEV --dtype=bfloat16 ${DEMO[@]+"${DEMO[@]}"}
GRID+=(--data_dir "$WORK/data" --repeats 1)
step grid_6x384 "$PY" -m bench.training "${GRID[@]}" --modes eager,graphs,compile,reduce-overhead "${NORMS[@]}" \
    --out "$RES/grid_6x384.json"
step profile "$PY" -m bench.profile "${PROFILE[@]}" --data_dir "$WORK/data" --device $DEV --out "$RES/profile.json"
step decode "$PY" -m bench.decoding --device $DEV --paths cached,mode ${DECODE[@]+"${DECODE[@]}"} \
    --out "$RES/decode.json"
step matmul "$PY" -m bench.decoding --device $DEV --matmul ${MATMUL[@]+"${MATMUL[@]}"} --out "$RES/matmul.json"
FASTEST=$("$PY" -c "import json, sys; s = json.load(open(sys.argv[1]))['sides']; print(min((v['ms_per_iter'], k)
    for k, v in s.items() if v['ms_per_iter'] and not k.startswith('custom'))[1])" "$RES/grid_6x384.json" 2>/dev/null)
read -r NORM MODE <<<"${FASTEST:-builtin eager}"
step full_run "$PY" -m bench.training "${FULL[@]}" --curves --norms "$NORM" --modes "$MODE" --repeats 1 \
    --target_val 1.47 --data_dir "$WORK/data" --set max_wall_s=$(($(share full_run) * 4 / 5)) --verbose \
    --out "$RES/full_run.json"
step grid_12x768 "$PY" -m bench.training "${GRID[@]}" "${WIDE[@]}" --out "$RES/grid_12x768.json"
[[ -n $NANOGPT ]] && step nanogpt "$PY" -m bench.training "${FULL[@]}" --curves --norms "" --nanogpt "$NANOGPT" \
    --repeats 1 --target_val 1.47 --time_limit $(($(share nanogpt) - 5)) --verbose --out "$RES/nanogpt.json"
step kernels "$PY" -m bench.kernels --device $DEV ${KERNELS[@]+"${KERNELS[@]}"} --out "$RES/kernels.json"
step overhead "$PY" -m bench.kernels --device $DEV --overhead ${OVERHEAD[@]+"${OVERHEAD[@]}"} \
    --out "$RES/overhead.json"
pack && echo "total $(($(date +%s) - START)) s of $BUDGET; in $OUT_DIR:" && ls "$OUT_DIR"
