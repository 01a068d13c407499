#!/usr/bin/env bash
# Every GPU measurement in one run of at most 8 minutes by its own clock (bench/README.md says what each step does).
#
#   OUT=FOLDER bash bench/gpu.sh [--dry-run] [--input TINY_SHAKESPEARE.txt] [--nanogpt NANOGPT_CHECKOUT] [--commit REV]
#
# OUT: the folder its three result files go to (default bench/results/gpu). PY: the python that has torch (default
# python3). SHARES: each step's share of the 480-s budget in s and the time it is estimated to take (bench/README.md:
# where each estimate comes from), in the order the steps run. GPU_SH_BUDGET_S scales every share (default 480 s,
# 1440 s with --dry-run); GPU_SH_STEPS="data,tests:30 ...": run only those steps (the others: not selected), NAME:S
# with a limit of S seconds instead of its share. --commit (or BENCH_COMMIT): the commit measured, for a copy of the
# tree without git.
set -u
cd "$(dirname "$0")/.." || exit 1
fail() { echo "bench/gpu.sh: $1" >&2 && exit 2; }
DRY=0 INPUT=${TINY_SHAKESPEARE:-data/shakespeare_char/input.txt} NANOGPT=${NANOGPT:-} OUT_DIR=${OUT:-bench/results/gpu}
while (($#)); do
    case $1 in
        --dry-run) DRY=1 ;;
        --input) INPUT=$2 && shift ;;
        --nanogpt) NANOGPT=$2 && shift ;;
        --commit) export BENCH_COMMIT=$2 && shift ;;
        -h | --help) sed -n '2,/^set -u/s/^# \{0,1\}//p' bench/gpu.sh && exit 0 ;;
        -*) fail "unknown option '$1'; options: --dry-run, --input PATH, --nanogpt PATH, --commit REV, --help" ;;
        *) fail "unexpected argument '$1': the output folder is \$OUT (OUT=$1 bash bench/gpu.sh ...)" ;;
    esac
    shift
done
if [[ -n $NANOGPT ]]; then WIDE=0:0 NANO=60:55; else WIDE=60:50 NANO=0:0; fi
SHARES=(report:15:10 data:5:1 grid_6x384:75:70 demo_float32:20:15 demo_bfloat16:20:15 decode:20:15 kernels:20:14
    grid_6x384_compile:85:70 grid_6x384_reduce_overhead:55:50 full_run:65:65 grid_12x768:$WIDE nanogpt:$NANO
    overhead:12:11 tests:28:25)
PY=${PY:-python3} BUDGET=${GPU_SH_BUDGET_S:-$((DRY ? 1440 : 480))} START=$(date +%s)
share() {  # share NAME: its seconds of BUDGET
    local item && for item in "${SHARES[@]}"; do
        [[ ${item%%:*} == "$1" ]] && item=${item#*:} && echo $((${item%:*} * BUDGET / 480)) && return
    done
}
[[ -s $INPUT ]] || fail "no Tiny Shakespeare at '$INPUT': give its path with --input PATH (or TINY_SHAKESPEARE)"
[[ -z $NANOGPT || -f $NANOGPT/train.py ]] || fail "--nanogpt '$NANOGPT' is not a nanoGPT checkout (no train.py)"
mkdir -p "$OUT_DIR" 2>/dev/null && [[ -w $OUT_DIR ]] || fail "output folder '$OUT_DIR' is not writable"
OUT_DIR=$(cd "$OUT_DIR" && pwd) WORK=$(mktemp -d) && RES=$WORK/gpu_results && mkdir -p "$RES"
# A step runs in a process group of its own (timeout makes one), named in step.pid while it runs: stopping this
# script (SIGINT, SIGTERM) stops it too. (SIGKILL cannot be caught: a caller's limit should send SIGTERM first.)
trap '[[ -s $WORK/step.pid ]] && kill -KILL -- "-$(<"$WORK/step.pid")" 2>/dev/null; rm -rf "$WORK"' EXIT
trap 'exit 130' INT && trap 'exit 143' TERM
# One python for the checks: the machine (commit, versions, GPU), and exit 3 where CUDA is needed and absent.
CHECK="import json, sys; from machinery.measure import machine_info; m = machine_info(); print(json.dumps(m))
sys.exit(3 if not m['gpu'] and not $DRY else 0)"
"$PY" -c "$CHECK" >"$RES/machine.json" 2>"$WORK/check.log"
case $? in
    0) ;;
    3) fail "no CUDA device here; try --dry-run" ;;
    *) cat "$WORK/check.log" >&2 && fail "'$PY' could not report the machine (its error above); set PY to the python \
that has torch" ;;
esac
COMMIT=$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['commit'] or '')" "$RES/machine.json")
[[ -n $COMMIT ]] && export BENCH_COMMIT=$COMMIT  # every step's JSON names it, as machine.json does
# The mode's row sums on CUDA tensors (batch_invariant/): off by default until a GPU run passes them.
export BATCH_INVARIANT_CUDA_ROW_SUMS=1
if ((DRY)); then
    export TRITON_INTERPRET=1
    DEV=cpu TINY=(--set n_layer=1 --set n_head=2 --set n_embd=32 --set block_size=16 --set batch_size=4)
    GRID=(--config configs/shakespeare_char_cpu.json "${TINY[@]}" --warmup 2 --iters 3 --eval_iters 1)
    FULL=("${GRID[@]}" --set max_iters=4 --set eval_interval=2 --set eval_iters=1 --set log_interval=1)
    NORMS=(--norms builtin,triton:eager) WIDE=(--norms builtin) DEMO=(--norms builtin --prompt_len 4 --new_tokens 4)
    TESTS=(--collect-only) DECODE=(--sizes configs/shakespeare_char_cpu.json --batches 1 --new_tokens 3 --repeats 1)
    KERNELS=(--sizes 32 --rows 16 --reps 1) OVERHEAD=(--calls 10 --repeats 1)
else
    unset TRITON_INTERPRET  # the kernels must compile for the GPU
    DEV=cuda GRID=(--config configs/shakespeare_char.json --warmup 10 --iters 30 --eval_iters 5)
    FULL=(--config configs/shakespeare_char.json) NORMS=(--norms builtin,triton,custom:eager)
    WIDE=(--set n_layer=12 --set n_head=12 --set n_embd=768 --norms builtin,triton)
    DEMO=(--config configs/shakespeare_char.json) TESTS=() DECODE=()  # the demo 384 wide: see bench/README.md
    KERNELS=(--system-malloc) OVERHEAD=(--system-malloc)  # (the timed tensors live on the GPU, not in glibc's heap)
fi
# One Inductor and Triton cache for the whole run: a later step loads what an earlier one compiled.
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=$WORK/inductor_cache TRITON_CACHE_DIR=$WORK/triton_cache
rm -f "$OUT_DIR"/{summary.md,results.json,gpu_results.tar.gz}
SUM=0 PLAN="" && for item in "${SHARES[@]}"; do
    name=${item%%:*} && SUM=$((SUM + $(share "$name"))) PLAN+="$name $(share "$name") (est. ${item##*:}), "
done
echo "Commit ${COMMIT:-unknown (no git here: give --commit REV)}. Budget $BUDGET s; each step's share in s (estimate): ${PLAN%, }; sum $SUM s." |
    tee "$RES/plan.txt"
: >"$RES/steps.tsv"
pack() {  # the three files from what is done so far
    timeout 20 "$PY" -m bench.common "$RES" "$OUT_DIR" || tar czf "$OUT_DIR/gpu_results.tar.gz" -C "$WORK" gpu_results
}
pack

# step NAME COMMAND...: COMMAND under timeout with the step's share (SIGINT first, so that pytest and the benchmarks
# still report; SIGKILL 5 s later), its output to the console and $RES/NAME.log, its exit code and seconds to
# $RES/steps.tsv; then the three files again. Once it returns, whatever is left of its process group is killed:
# nothing it started (Inductor's compile workers ignore SIGINT) runs on into the next step.
step() {
    local name=$1 limit && limit=$(share "$1") && shift
    local left=$((BUDGET - $(share report) / 2 - $(date +%s) + START)) t0=$SECONDS why=""
    local picked=no selection=${GPU_SH_STEPS:-}  # (picked: named there, with or without a limit of its own)
    [[ " ${selection//,/ } " =~ \ $name(:([0-9]+))?\  ]] && picked=yes && limit=${BASH_REMATCH[2]:-$limit}
    ((left < limit)) && limit=$left
    ((limit < 5)) && why="budget spent" && [[ " ${SHARES[*]} " == *" $name:0:"* ]] && why="no share"
    [[ -n $selection && $picked == no ]] && why="not selected"
    [[ -n $why ]] && printf "%s\tskipped (%s)\t0\t0\n" "$name" "$why" >>"$RES/steps.tsv" && return
    echo "=== $name (at most ${limit} s; $(($(date +%s) - START)) of ${BUDGET} s spent): $*"
    { bash -c 'echo $$ >"$0" && exec "$@"' "$WORK/step.pid" timeout -s INT -k 5 "$limit" "$@"
        echo $? >"$WORK/step.rc" && kill -KILL -- "-$(<"$WORK/step.pid")" 2>/dev/null; } 2>&1 | tee "$RES/$name.log" &
    wait $!  # (in the background, so that a signal to this script is handled at once, by the trap above)
    rm -f "$WORK/step.pid"
    printf "%s\t%s\t%s\t%s\n" "$name" "$(<"$WORK/step.rc")" $((SECONDS - t0)) "$limit" >>"$RES/steps.tsv"
    pack
}
step data "$PY" data/shakespeare_char/prepare.py --input "$INPUT" --out_dir "$WORK/data"
GRID+=(--data_dir "$WORK/data" --repeats 1)
step grid_6x384 "$PY" -m bench.training "${GRID[@]}" --modes eager,graphs "${NORMS[@]}" --out "$RES/grid_6x384.json"
step demo_float32 "$PY" batch_independence.py --device=$DEV "${DEMO[@]}" --out "$RES/demo_float32.json"
step demo_bfloat16 "$PY" batch_independence.py --device=$DEV --dtype=bfloat16 "${DEMO[@]}" \
    --out "$RES/demo_bfloat16.json"
step decode "$PY" -m bench.decoding --device $DEV --paths cached,mode ${DECODE[@]+"${DECODE[@]}"} \
    --out "$RES/decode.json"
step kernels "$PY" -m bench.kernels --device $DEV "${KERNELS[@]}" --out "$RES/kernels.json"
step grid_6x384_compile "$PY" -m bench.training "${GRID[@]}" --modes compile --norms builtin,triton \
    --out "$RES/grid_6x384_compile.json"
step grid_6x384_reduce_overhead "$PY" -m bench.training "${GRID[@]}" --modes reduce-overhead --norms builtin,triton \
    --out "$RES/grid_6x384_reduce_overhead.json"
FASTEST=$("$PY" -c "import json, sys; s = {k: v for f in sys.argv[1:] for k, v in json.load(open(f))['sides'].items()}
print(min((v['ms_per_iter'], k) for k, v in s.items() if v['ms_per_iter'] and not k.startswith('custom'))[1])" \
    "$RES"/grid_6x384*.json 2>/dev/null)
read -r NORM MODE <<<"${FASTEST:-builtin eager}"
# train.py stops at max_wall_s, then evaluates once more: 15 s of the share are kept for that and the start. TARGET:
# a val loss the run reaches in that time (bench/README.md: full_run).
TARGET=1.50
step full_run "$PY" -m bench.training "${FULL[@]}" --curves --norms "$NORM" --modes "$MODE" --repeats 1 \
    --target_val $TARGET --data_dir "$WORK/data" --set max_wall_s=$(($(share full_run) - 15)) --verbose \
    --out "$RES/full_run.json"
step grid_12x768 "$PY" -m bench.training "${GRID[@]}" "${WIDE[@]}" --modes eager,graphs --out "$RES/grid_12x768.json"
[[ -n $NANOGPT ]] && step nanogpt "$PY" -m bench.training "${FULL[@]}" --curves --norms "" --nanogpt "$NANOGPT" \
    --repeats 1 --target_val $TARGET --time_limit $(($(share nanogpt) - 10)) --verbose --out "$RES/nanogpt.json"
step overhead "$PY" -m bench.kernels --device $DEV --overhead "${OVERHEAD[@]}" --out "$RES/overhead.json"
step tests "$PY" -m pytest -q -p no:cacheprovider tests/test_batch_invariant_triton.py ${TESTS[@]+"${TESTS[@]}"}
echo "Total $(($(date +%s) - START)) s of $BUDGET." | tee -a "$RES/plan.txt"
pack && echo "In $OUT_DIR:" && ls "$OUT_DIR"
