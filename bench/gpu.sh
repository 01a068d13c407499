#!/usr/bin/env bash
# One prepared run on a CUDA machine: every step under one total budget (at most 8 minutes), and its results as
# three files, so that all of it comes back from a machine that returns at most 8.
#
#   GPU_SH_COMMIT=$(git rev-parse --short HEAD) OUT=/results bash bench/gpu.sh [TINY_SHAKESPEARE_TXT]
#   bash bench/gpu.sh --dry-run [TINY_SHAKESPEARE_TXT]
#
# TINY_SHAKESPEARE_TXT defaults to .gpu_data/tinyshakespeare.txt (the GPU machine has no network: bring the text).
# --dry-run runs every step on the CPU at tiny sizes (Triton's interpreter) and leaves the same files: it checks
# the plumbing here before GPU time is spent. GPU_SH_COMMIT names the commit measured (the machine may have no
# .git); OUT is the results folder (default bench/results/gpu); GPU_SH_BUDGET_S the total (default 480).
#
# The files in $OUT, and nothing else (tests/test_gpu_sh.py checks the set):
#   summary.md          each step's exit code, seconds and limit, and the headline figures
#   results.json        the raw results of every step that wrote any
#   gpu_results.tar.gz  everything: each step's log and JSON, both runs' metrics.jsonl
#
# Steps, in order, each under `timeout` and capped by what is left of the budget, less the report's share, so the
# report is always reached (a step that fails or overruns costs only itself; its exit code goes in the summary):
#   step             share  what
#   info              10 s  nvidia-smi, machine and versions
#   data              10 s  prepare Tiny Shakespeare (char) from the carried text
#   triton_check      30 s  Triton against F.layer_norm, forward and backward, fp32 and bf16, judged against float64
#   train_triton     240 s  configs/shakespeare_char.json with norm=triton, 5000 iterations (max_wall_s stops it
#                           cleanly, with a final eval, a checkpoint and a sample, 35 s before its timeout)
#   train_builtin     30 s  the same config with builtin for 500 iterations: ms/iter, tokens/s
#   train_report      10 s  both runs' ms/iter (median, warmup and evals left out), tokens/s, val loss
#   swap_norms        15 s  the triton run's checkpoint sampled greedily with triton, builtin and custom
#   bench_layernorm   40 s  bench/bench_layernorm.py: bf16 and fp32, C 768..8192, the device's copy bandwidth
#   overhead          20 s  bench/triton_overhead.py: Python-side cost per call, Triton against F.layer_norm
#   tests             60 s  pytest tests/test_layernorm*.py on the GPU (SIGINT at the limit: pytest still reports)
#   report            15 s  summary.md, results.json, gpu_results.tar.gz (reserved: always runs)
#                   -----
#                    480 s
set -u
cd "$(dirname "$0")/.." || exit 1

DRY=0
if [[ "${1:-}" == "--dry-run" ]]; then
    DRY=1
    shift
fi
DATA=${1:-.gpu_data/tinyshakespeare.txt}
if [[ $DRY == 1 && -z "${1:-}" && ! -f "$DATA" ]]; then
    DATA=../shared/data/tinyshakespeare.txt  # a developer's checkout has it there
fi
OUT=${OUT:-bench/results/gpu}
PY=${PY:-python3}
BUDGET=${GPU_SH_BUDGET_S:-480}
COMMIT=${GPU_SH_COMMIT:-unknown}

# --- preflight: everything the run needs, checked in seconds, before any of the budget is spent ------------------
fail() {
    echo "bench/gpu.sh: $1" >&2
    exit 2
}
[[ -s "$DATA" ]] || fail "Tiny Shakespeare not found at '$DATA' (this machine may have no network). To fix: \
mkdir -p .gpu_data && cp ../shared/data/tinyshakespeare.txt .gpu_data/, and name .gpu_data in the run's carry, \
or pass the text's path as the first argument"
mkdir -p "$OUT" 2>/dev/null && touch "$OUT/.write_test" 2>/dev/null && rm -f "$OUT/.write_test" \
    || fail "results folder '$OUT' is not writable; set OUT to a writable folder"
"$PY" -c "import torch" 2>/dev/null || fail "'$PY' cannot import torch; set PY to the python that has it"
if [[ $DRY == 0 ]]; then
    "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
        || fail "no CUDA device here (torch.cuda.is_available() is False); run on a GPU machine, or use --dry-run"
    "$PY" -c "import triton" 2>/dev/null || fail "'$PY' cannot import triton; install it (Linux) or carry its wheel"
fi
[[ "$COMMIT" == unknown ]] && echo "bench/gpu.sh: GPU_SH_COMMIT is not set; the results will say commit 'unknown'"

OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_sh.XXXXXX")
RES=$WORK/results  # everything that goes into the tarball
mkdir -p "$RES"
rm -f "$OUT/summary.md" "$OUT/results.json" "$OUT/gpu_results.tar.gz"
STEPS_TSV=$RES/steps.tsv
START=$(date +%s)

if [[ $DRY == 1 ]]; then
    export TRITON_INTERPRET=1
    DEVICE=cpu
    TINY=(--n_layer=1 --n_head=2 --n_embd=32 --block_size=32 --batch_size=4 --eval_iters=2 --sample_tokens=20
          --log_interval=1 --eval_interval=3 --lr_decay_iters=50 --warmup_iters=2)
    TRITON_RUN=("${TINY[@]}" --max_iters=6)
    BUILTIN_RUN=("${TINY[@]}" --max_iters=6)
    CHECK_SHAPES="16x96"
    BENCH_LN=(--device cpu --quick --sizes 64 --rows 32 --reps 1)
    OVERHEAD=(--calls 200)
    TESTS=(tests/test_layernorm_triton.py -k "opcheck or deterministic")
    REPORT_WARMUP=2
    BUDGET=${GPU_SH_BUDGET_S:-1200}
    SCALE=4  # the interpreter is slow: every share x4 on the CPU
else
    unset TRITON_INTERPRET  # the GPU run must compile the kernels, whatever the caller's environment says
    DEVICE=cuda
    TRITON_RUN=()
    BUILTIN_RUN=(--max_iters=500 --lr_decay_iters=5000)
    CHECK_SHAPES="32768x768,8192x4096,4096x8192"
    BENCH_LN=(--device cuda)
    OVERHEAD=(--device cuda --calls 300 --repeats 3)
    TESTS=(tests/test_layernorm.py tests/test_layernorm_triton.py)
    # pytest-xdist, where installed, compiles the tests' ~100 kernel variants on several cores at once
    "$PY" -c "import xdist" 2>/dev/null && TESTS+=(-n 8)
    REPORT_WARMUP=10
    SCALE=1
fi
declare -A SHARE=([info]=10 [data]=10 [triton_check]=30 [train_triton]=240 [train_builtin]=30 [train_report]=10 [swap_norms]=15
                  [bench_layernorm]=40 [overhead]=20 [tests]=60)
REPORT_SHARE=15
DATA_DIR=$WORK/data
export PYTHONUNBUFFERED=1

# The limit of a step: its share, or what is left of the budget after the report's share, if that is less.
limit_for() {
    local left=$((BUDGET - REPORT_SHARE - ($(date +%s) - START)))
    local limit=$((${SHARE[$1]} * SCALE))
    ((left < limit)) && limit=$left
    echo "$limit"
}

# step NAME [--signal SIG] COMMAND...: COMMAND under timeout, its output to the console and $RES/NAME.log.
step() {
    local name=$1 signal=TERM
    shift
    if [[ "$1" == --signal ]]; then
        signal=$2
        shift 2
    fi
    local limit
    limit=$(limit_for "$name")
    if ((limit < 5)); then
        printf "%s\tskipped\t0\t%s\n" "$name" "$limit" >>"$STEPS_TSV"
        echo "=== $name: skipped, the budget of ${BUDGET}s is spent"
        return 0
    fi
    echo "=== $name (limit ${limit}s): $*"
    local t0=$SECONDS
    # SIGTERM (train.py then saves a checkpoint and exits; pytest gets SIGINT and still reports), SIGKILL 5 s later
    timeout -s "$signal" --kill-after=5 "$limit" "$@" 2>&1 | tee "$RES/$name.log"
    printf "%s\t%s\t%s\t%s\n" "$name" "${PIPESTATUS[0]}" $((SECONDS - t0)) "$limit" >>"$STEPS_TSV"
}

TRAIN=("$PY" train.py configs/shakespeare_char.json --device=$DEVICE --data_dir="$DATA_DIR" --compile=False)

step info "$PY" bench/gpu_report.py machine "$RES/machine.json"
step data "$PY" data/shakespeare_char/prepare.py --input "$DATA" --out_dir "$DATA_DIR"
step triton_check "$PY" bench/gpu_report.py triton-check "$CHECK_SHAPES" "$DEVICE" "$RES/triton_check.json"
step train_triton "${TRAIN[@]}" --norm=triton --out_dir="$WORK/triton" ${TRITON_RUN[@]+"${TRITON_RUN[@]}"} \
    --max_wall_s=$(($(limit_for train_triton) - 35))
step train_builtin "${TRAIN[@]}" --norm=builtin --out_dir="$WORK/builtin" --sample_at_end=False \
    ${BUILTIN_RUN[@]+"${BUILTIN_RUN[@]}"} --max_wall_s=$(($(limit_for train_builtin) - 20))
step train_report "$PY" bench/bench_train.py report "$WORK/triton" "$WORK/builtin" --warmup "$REPORT_WARMUP" \
    --out "$RES/train_report.json"
step swap_norms "$PY" bench/gpu_report.py swap-norms "$WORK/triton" "$DEVICE" "$RES/swap_norms.json"
step bench_layernorm "$PY" bench/bench_layernorm.py "${BENCH_LN[@]}" --json "$RES/bench_layernorm.json" \
    --out "$RES/bench_layernorm.md"
step overhead "$PY" bench/triton_overhead.py "${OVERHEAD[@]}" --json "$RES/overhead.json"
step tests --signal INT "$PY" -m pytest "${TESTS[@]}" -q -p no:cacheprovider

# --- report: always reached ---------------------------------------------------------------------------------------
for run in triton builtin; do
    [[ -f "$WORK/$run/metrics.jsonl" ]] && cp "$WORK/$run/metrics.jsonl" "$RES/metrics_$run.jsonl"
done
timeout -s KILL $((REPORT_SHARE * SCALE)) "$PY" bench/gpu_report.py pack "$RES" "$OUT" --commit "$COMMIT" \
    --dry-run "$DRY" --budget "$BUDGET" --elapsed $(($(date +%s) - START)) \
    || tar czf "$OUT/gpu_results.tar.gz" -C "$RES" .  # the pack failed: at least the logs come back
rm -rf "$WORK"
echo
cat "$OUT/summary.md" 2>/dev/null
ls -l "$OUT"
