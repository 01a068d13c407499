#!/usr/bin/env bash
# One prepared run on a CUDA machine, under 8 minutes, everything written to one results folder.
#
#   bench/gpu.sh [TINY_SHAKESPEARE_TXT]          # default .gpu_data/tinyshakespeare.txt (no internet there)
#   OUT=/some/dir bench/gpu.sh                   # results folder (default bench/results/gpu)
#   bench/gpu.sh --dry-run   (or GPU_SH_CPU_SMOKE=1 bench/gpu.sh)
#                                                # every step on the CPU with tiny sizes (Triton's interpreter):
#                                                # checks the plumbing here before GPU time is spent
#
# Environment: PY (default /opt/torch/.venv/bin/python3, else .venv/bin/python, else python3), OUT,
# GPU_SH_STEPS=comma,list (run only these steps), GPU_SH_BUDGET_S (total, default 465), GPU_SH_COMPILE=1
# (torch.compile the training runs; see below), GPU_SH_WORK (scratch for checkpoints, default /tmp/gpu_sh_work).
#
# Steps, in order, each under `timeout` (a failure or an overrun costs only that step; every exit code goes to
# $OUT/summary.txt) and capped by what is left of the total budget:
#   step            budget  what
#   info              15 s  nvidia-smi, machine and versions (machine.json)
#   data              15 s  prepare Tiny Shakespeare (char) from the carried copy
#   triton_check      40 s  Triton LayerNorm against F.layer_norm on the GPU, forward and backward, fp32 and bf16
#                           (independent of pytest, which the GPU's python may lack); its JIT compiles also
#                           fill Triton's kernel cache for the steps after it
#   train_triton     220 s  the full shakespeare_char run, 5000 iterations, norm=triton (max_wall_s stops it
#                           cleanly, with a final eval, a checkpoint and a sample, 20 s before its timeout)
#   train_builtin     35 s  the same config with builtin for 500 iterations (same schedule): ms/iter, tokens/s
#   report            10 s  both runs' ms/iter (median, warmup and evals excluded), tokens/s, val loss, wall
#   bench_layernorm   50 s  bench/bench_layernorm.py on CUDA: bf16 and fp32, C 768..8192, device copy bandwidth
#                           (it writes its JSON after every shape, so a cut-short run keeps what it measured)
#   decode            25 s  cached vs uncached decoding tokens/s at both model sizes
#   tests             55 s  pytest tests/test_layernorm*.py -x -q on the GPU (conftest sets no interpreter there)
#                   ----
#                    465 s  = GPU_SH_BUDGET_S: every timeout (python and CUDA start-up included) is capped by
#                           what is left of it, so the whole script ends within about 7 min 50 s
#
# Why eager (compile off) by default: the 5000-iteration run is about 10 ms/iter eager on an H200 (launch-bound
# small model), about 1.5 min with its 21 evals, so compile would win little after its own ~1 min (plus a
# recompile for eval mode) on a cold machine; torch.compile of the Triton custom op cannot be tried on a CPU
# before the GPU run; and under compile inductor fuses builtin's LayerNorm into its own generated kernel while
# the Triton op stays opaque, so eager is also the fair triton-vs-builtin comparison. GPU_SH_COMPILE=1 turns it on.
set -u

cd "$(dirname "$0")/.." || exit 1
REPO=$(pwd)

SMOKE=${GPU_SH_CPU_SMOKE:-0}
if [[ "${1:-}" == "--dry-run" ]]; then
    SMOKE=1
    shift
fi
# `bench/gpu.sh __step NAME` runs one of the shell functions below (timeout can only run a program, so a step
# that is a function re-enters this script); everything it needs comes through the environment exported below.
INNER_STEP=
if [[ "${1:-}" == "__step" ]]; then
    INNER_STEP=$2
    shift 2
fi
DATA=${1:-${GPU_SH_DATA:-.gpu_data/tinyshakespeare.txt}}
if [[ "$SMOKE" == 1 && ! -f "$DATA" && -f ../shared/data/tinyshakespeare.txt ]]; then
    DATA=../shared/data/tinyshakespeare.txt
fi
OUT=${OUT:-bench/results/gpu}
WORK=${GPU_SH_WORK:-/tmp/gpu_sh_work}
BUDGET=${GPU_SH_BUDGET_S:-465}  # 7 min 45 s
COMPILE=$([[ "${GPU_SH_COMPILE:-0}" == 1 ]] && echo True || echo False)
STEPS=${GPU_SH_STEPS:-all}

if [[ -z "${PY:-}" ]]; then
    for candidate in /opt/torch/.venv/bin/python3 .venv/bin/python python3; do
        if command -v "$candidate" >/dev/null 2>&1; then
            PY=$candidate
            break
        fi
    done
fi
# A pytest carried in .gpu_data/pylib (pip install --target .gpu_data/pylib ...) when the GPU's python has none.
if [[ -d .gpu_data/pylib ]] && ! "$PY" -c "import pytest" >/dev/null 2>&1; then
    export PYTHONPATH="$REPO/.gpu_data/pylib${PYTHONPATH:+:$PYTHONPATH}"
fi

mkdir -p "$OUT" "$WORK"
OUT=$(cd "$OUT" && pwd)
SUMMARY="$OUT/summary.txt"
export GPU_SH_CPU_SMOKE=$SMOKE GPU_SH_DATA=$DATA OUT WORK PY

if [[ "$SMOKE" == 1 ]]; then
    # CPU: tiny sizes through exactly the same commands; Triton runs in its interpreter.
    export TRITON_INTERPRET=1
    DEVICE=cpu
    DATA_DIR="$WORK/data"
    TINY=(--n_layer=1 --n_head=2 --n_embd=32 --block_size=32 --batch_size=4 --eval_iters=2 --sample_tokens=20
          --log_interval=1)
    TRITON_RUN=("${TINY[@]}" --max_iters=6 --eval_interval=3 --lr_decay_iters=50 --warmup_iters=2)
    BUILTIN_RUN=("${TINY[@]}" --max_iters=6 --eval_interval=3 --lr_decay_iters=50 --warmup_iters=2)
    DECODE_ARGS=(--set n_layer=1 --set n_head=2 --set n_embd=32 --new_tokens 40 --repeats 1)
    CHECK_SHAPES="64x96,16x768"
    REPORT_WARMUP=2
    WALL_MARGIN_S=30
    BUDGET=${GPU_SH_BUDGET_S:-100000}  # no total cap by default on the CPU, where the interpreter is slow
    declare -A TIMEOUTS=([info]=60 [data]=60 [triton_check]=300 [train_triton]=600 [train_builtin]=300
                         [report]=60 [bench_layernorm]=600 [tests]=1200 [decode]=300)
else
    # The GPU run must not use the interpreter, whatever the caller's environment says.
    unset TRITON_INTERPRET
    DEVICE=cuda
    DATA_DIR=${GPU_SH_DATA_DIR:-data/shakespeare_char}
    TRITON_RUN=()
    WALL_MARGIN_S=20  # start-up before train.py starts its clock, the final eval, checkpoint and sample
    BUILTIN_RUN=(--max_iters=500 --lr_decay_iters=5000)
    DECODE_ARGS=()
    CHECK_SHAPES="32768x768,8192x4096,4096x8192"
    REPORT_WARMUP=10
    declare -A TIMEOUTS=([info]=15 [data]=15 [triton_check]=40 [train_triton]=220 [train_builtin]=35
                         [report]=10 [bench_layernorm]=50 [decode]=25 [tests]=55)
fi


wanted() {
    [[ "$STEPS" == all || ",$STEPS," == *",$1,"* ]]
}

# The timeout of a step: its own, or what is left of the total budget if that is less.
limit_for() {
    local left=$((BUDGET - ($(date +%s) - START)))
    local limit=${TIMEOUTS[$1]}
    ((left < limit)) && limit=$left
    echo "$limit"
}

# step NAME COMMAND...: run COMMAND under timeout, output to the console and $OUT/NAME.log, exit code to the summary.
step() {
    local name=$1
    shift
    if ! wanted "$name"; then
        printf "%-16s %-6s %8s %8s  %s\n" "$name" skip - - "(not in GPU_SH_STEPS)" >>"$SUMMARY"
        return 0
    fi
    local limit
    limit=$(limit_for "$name")
    if ((limit < 5)); then
        printf "%-16s %-6s %8s %8s  %s\n" "$name" skip - - "(total budget spent)" >>"$SUMMARY"
        echo "=== $name: skipped, the total budget of ${BUDGET}s is spent"
        return 0
    fi
    echo "=== $name (timeout ${limit}s): $*"
    local t0 t1 rc ms
    t0=$(date +%s%N)
    # SIGTERM first (train.py then saves a checkpoint and exits), SIGKILL 5 s later.
    timeout --kill-after=5 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    rc=${PIPESTATUS[0]}
    t1=$(date +%s%N)
    ms=$(((t1 - t0) / 1000000))
    printf "%-16s %-6s %6d.%d %8s  %s\n" "$name" "$rc" $((ms / 1000)) $((ms % 1000 / 100)) "$limit" "$name.log" \
        >>"$SUMMARY"
    return 0
}

# A step that is one of the functions below: run through this script again, so that timeout can kill it.
fn_step() {
    step "$1" bash "$REPO/bench/gpu.sh" __step "$1"
}

info() {
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi
        nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,power.limit,driver_version \
            --format=csv
    else
        echo "nvidia-smi: not found (no NVIDIA driver on this machine)"
    fi
    "$PY" - "$OUT/machine.json" <<'EOF'
import json, sys
sys.path.insert(0, "bench")
from common import machine_info
info = machine_info()
print(json.dumps(info, indent=2))
open(sys.argv[1], "w").write(json.dumps(info, indent=2) + "\n")
EOF
}

triton_check() {
    "$PY" - "$CHECK_SHAPES" "$DEVICE" <<'EOF'
# Triton's LayerNorm against PyTorch's on this device: forward and the three gradients, fp32 and bf16, each
# judged against a float64 reference as the tests do (error at most 2x PyTorch's own in that dtype + a small atol).
import sys
import torch
import torch.nn.functional as F
from layernorm import layer_norm_triton

shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[1].split(",")]
device = sys.argv[2]
torch.manual_seed(0)
failed = False
print(f"{'shape':>14} {'dtype':>9} {'what':>4} {'triton err':>11} {'builtin err':>11}  ok")
for n, c in shapes:
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.randn(n, c, device=device) * 2 + 0.5).to(dtype)
        w = (torch.randn(c, device=device) * 0.1 + 1).to(dtype)
        b = (torch.randn(c, device=device) * 0.1).to(dtype)
        dy = torch.randn(n, c, device=device).to(dtype)

        def run(fn, dt):
            xs, ws, bs = (t.detach().to(dt).requires_grad_() for t in (x, w, b))
            y = fn(xs, ws, bs)
            grads = torch.autograd.grad(y, (xs, ws, bs), dy.to(dt))
            return [y.detach(), *grads]

        builtin = lambda a, ww, bb: F.layer_norm(a, (c,), ww, bb, 1e-5)
        ref = run(builtin, torch.float64)
        tri = run(lambda a, ww, bb: layer_norm_triton(a, ww, bb, 1e-5), dtype)
        pt = run(builtin, dtype)
        for what, r, t, p in zip(("y", "dx", "dw", "db"), ref, tri, pt):
            scale = r.abs().max().item() or 1.0
            et = (t.double() - r).abs().max().item() / scale
            ep = (p.double() - r).abs().max().item() / scale
            ok = et <= 2 * ep + (1e-5 if dtype == torch.float32 else 1e-2)
            failed |= not ok
            print(f"{n:>6}x{c:<7} {str(dtype)[6:]:>9} {what:>4} {et:11.2e} {ep:11.2e}  {'ok' if ok else 'FAIL'}")
sys.exit(1 if failed else 0)
EOF
}

bench_layernorm() {
    if [[ ! -f bench/bench_layernorm.py ]]; then
        echo "bench/bench_layernorm.py not found"
        return 1
    fi
    if [[ "$SMOKE" == 1 ]]; then
        "$PY" bench/bench_layernorm.py "${BENCH_LN_SMOKE_ARGS[@]}"
    else
        "$PY" bench/bench_layernorm.py "${BENCH_LN_ARGS[@]}"
    fi
}
# bench/bench_layernorm.py's flags (its CUDA mode: bf16 and fp32, C 768..8192, rows to fill the GPU, copy
# bandwidth); the smoke flags keep it tiny on the CPU.
BENCH_LN_ARGS=(--device cuda --json "$OUT/bench_layernorm.json" --out "$OUT/bench_layernorm.md")
BENCH_LN_SMOKE_ARGS=(--device cpu --quick --json "$OUT/bench_layernorm.json" --out "$OUT/bench_layernorm.md")

tests() {
    if ! "$PY" -c "import pytest" >/dev/null 2>&1; then
        echo "pytest is not installed for $PY (carry it: pip install --target .gpu_data/pylib pytest); triton_check covers the GPU numerics"
        return 3
    fi
    "$PY" -m pytest tests/test_layernorm*.py -x -q -p no:cacheprovider
}

report() {
    for run in triton builtin; do
        [[ -f "$WORK/$run/metrics.jsonl" ]] && cp "$WORK/$run/metrics.jsonl" "$OUT/metrics_$run.jsonl"
    done
    "$PY" bench/bench_train.py report "$WORK/triton" "$WORK/builtin" --warmup "$REPORT_WARMUP" \
        --out "$OUT/train_report.json"
}

if [[ -n "$INNER_STEP" ]]; then
    "$INNER_STEP"
    exit $?
fi

START=$(date +%s)
{
    echo "# bench/gpu.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) smoke=$SMOKE device=$DEVICE python=$PY compile=$COMPILE"
    if git rev-parse --short HEAD >/dev/null 2>&1; then
        echo "# commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD 2>/dev/null || echo ' (uncommitted changes)')"
    fi
    printf "%-16s %-6s %8s %8s  %s\n" step rc seconds timeout log
} >"$SUMMARY"
echo "results -> $OUT (scratch $WORK), python $PY, device $DEVICE, smoke=$SMOKE, budget ${BUDGET}s"
rm -rf "$WORK/triton" "$WORK/builtin"
TRAIN=("$PY" train.py configs/shakespeare_char.json --device=$DEVICE --data_dir="$DATA_DIR" --compile=$COMPILE)

fn_step info
step data "$PY" data/shakespeare_char/prepare.py --input "$DATA" --out_dir "$DATA_DIR"
fn_step triton_check
# max_wall_s: train.py stops by itself (final eval, checkpoint, summary) this long before its step's timeout.
step train_triton "${TRAIN[@]}" --norm=triton --out_dir="$WORK/triton" ${TRITON_RUN[@]+"${TRITON_RUN[@]}"} \
    --max_wall_s=$(($(limit_for train_triton) - WALL_MARGIN_S))
step train_builtin "${TRAIN[@]}" --norm=builtin --out_dir="$WORK/builtin" --sample_at_end=False ${BUILTIN_RUN[@]+"${BUILTIN_RUN[@]}"} \
    --max_wall_s=$(($(limit_for train_builtin) - WALL_MARGIN_S))
fn_step report
fn_step bench_layernorm
step decode "$PY" bench/bench_train.py decode --device $DEVICE --out "$OUT/decode.json" ${DECODE_ARGS[@]+"${DECODE_ARGS[@]}"}
fn_step tests

TOTAL=$(($(date +%s) - START))
echo "# total ${TOTAL}s" >>"$SUMMARY"
echo
cat "$SUMMARY"
