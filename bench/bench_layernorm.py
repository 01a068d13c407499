"""Time the LayerNorms alone: forward, and forward+backward, per implementation, at shapes [rows, C].

    python bench/bench_layernorm.py                        # CPU: C 128, 384, 768, 4096 at 16384 rows, float32
    python bench/bench_layernorm.py --device cuda          # CUDA: bf16 and fp32, C 768..8192 at 32768 rows
    python bench/bench_layernorm.py --quick                # a few small shapes: a smoke run, not a measurement
    python bench/bench_layernorm.py --sizes 384 --rows 4096 --impls custom,builtin --json out.json --out out.md

LayerNorm is memory-bound: a perfect fused forward reads x once and writes y once (2 * rows * C * bytes), and a
perfect forward+backward also reads x and dy and writes dx (5 * rows * C * bytes in all; weight and bias and the
per-row statistics are negligible). GB/s below is that minimal traffic over the measured time ("effective
bandwidth"), and "%copy" compares it with this machine's measured copy bandwidth (dst.copy_(src) of the same size),
the practical ceiling for the operation. Implementations that move more than the minimum (the from-scratch one
makes several passes) show a lower effective bandwidth: that is the point of the comparison.

Rows: custom (layer_norm, hand-written backward), builtin (F.layer_norm), triton (the fused kernels; CUDA only,
or the interpreter on CPU with TRITON_INTERPRET=1, slow), naive (the formula differentiated by autograd: what the
hand-written backward must beat). Timing: CPU, time.perf_counter around each call, median; CUDA, CUDA events
around each call after an L2 flush, median. The implementations take turns call by call, so a machine that
drifts (shared hosts, the allocator's state) shifts them all alike. Results are printed as a table and written
(after every measurement, so a run cut short keeps what it measured) to --json / --out.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import layernorm  # noqa: E402

try:
    from common import machine_info  # noqa: E402
except ImportError:  # the bench folder without its helpers: report the essentials
    def machine_info() -> dict[str, Any]:
        return {"torch": torch.__version__, "cuda": torch.cuda.is_available()}


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
IMPLS = ("custom", "builtin", "triton", "naive")
CPU_SIZES, CPU_ROWS = (128, 384, 768, 4096), 16384
CUDA_SIZES, CUDA_ROWS = (768, 1024, 2048, 4096, 8192), 4096 * 8
QUICK_SIZES, QUICK_ROWS = (128, 384), 256

# glibc hands large freed blocks back to the OS and page-faults them in again at the next allocation of that size.
# On a CPU that costs more than a LayerNorm of [16384, 384] and changes from run to run with the allocator's state
# (on a 2-core EPYC, builtin's fwd+bwd there took 5-7 ms with freed memory kept, 12-14 ms without). So by default
# the script re-runs itself with glibc told to keep freed memory: every implementation then runs on the same warm
# memory, and what is timed is the computation. --system-malloc keeps glibc's defaults, page faults included.
STEADY_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(4 << 30), "MALLOC_TRIM_THRESHOLD_": str(16 << 30)}


def malloc_mode() -> str:
    steady = all(os.environ.get(k) == v for k, v in STEADY_MALLOC.items())
    return "steady (glibc keeps freed memory)" if steady else "system default"


def impl_fn(name: str):
    if name == "custom":
        return lambda x, w, b: layernorm.layer_norm(x, w, b)
    if name == "builtin":
        return lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b)
    if name == "triton":
        return layernorm._triton_module().layer_norm_triton
    if name == "naive":
        return lambda x, w, b: layernorm.layer_norm_naive(x, w, b)
    raise SystemExit(f"unknown implementation {name!r}; choose from {', '.join(IMPLS)}")


# ----------------------------------------------------------------------------------------------------------------
# Timers: median milliseconds of each fn, the fns interleaved call by call (round-robin), so that drift in the
# machine (other tenants, CPU clocks, the state of the memory allocator) falls on every implementation alike.


def time_cpu(fns: dict[str, Any], reps: int, warmup: int) -> dict[str, float]:
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def time_cuda(fns: dict[str, Any], reps: int, warmup: int, flush: torch.Tensor) -> dict[str, float]:
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    torch.cuda.synchronize()
    events = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            flush.zero_()  # evict x, dy, ... from L2: every call reads from device memory, as in a training step
            start.record()
            fn()
            end.record()
            events[name].append((start, end))
    torch.cuda.synchronize()
    return {name: statistics.median(s.elapsed_time(e) for s, e in ev) for name, ev in events.items()}


class Timer:
    def __init__(self, device: torch.device, reps: int, warmup: int) -> None:
        self.device, self.reps, self.warmup = device, reps, warmup
        self.flush = torch.empty(256 * 2**20, dtype=torch.int8, device=device) if device.type == "cuda" else None

    def __call__(self, fns: dict[str, Any]) -> dict[str, float]:
        if self.device.type == "cuda":
            return time_cuda(fns, self.reps, self.warmup, self.flush)
        return time_cpu(fns, self.reps, self.warmup)


def forward_backward(fn, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, dy: torch.Tensor) -> None:
    torch.autograd.grad(fn(x, w, b), (x, w, b), dy)


def copy_gbps(rows: int, C: int, dtype: torch.dtype, device: torch.device, timer: Timer) -> float:
    """Measured copy bandwidth: read + write of one [rows, C] tensor."""
    src = torch.randn(rows, C, device=device).to(dtype)
    dst = torch.empty_like(src)
    ms = timer({"copy": lambda: dst.copy_(src)})["copy"]
    return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9


# ----------------------------------------------------------------------------------------------------------------
# One shape: every implementation, checked against builtin, then timed.


def bench_shape(rows: int, C: int, dtype: torch.dtype, device: torch.device, impls, timer: Timer) -> list[dict]:
    g = torch.Generator(device=device).manual_seed(0)  # drawn on the device: a GB of randn on a CPU is slow

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=device)

    x = (randn(rows, C) * 2 + 1).to(dtype).requires_grad_()
    w = (randn(C) * 0.1 + 1).to(dtype).requires_grad_()
    b = (randn(C) * 0.1).to(dtype).requires_grad_()
    dy = randn(rows, C).to(dtype)
    elem = x.element_size()
    gbps_copy = copy_gbps(rows, C, dtype, device, timer)
    with torch.no_grad():
        y_ref = F.layer_norm(x, (C,), w, b).float()
    fns = {name: impl_fn(name) for name in impls}
    errors = {}
    for name, fn in fns.items():
        with torch.no_grad():
            errors[name] = (fn(x, w, b).float() - y_ref).abs().max().item()
    fwd = timer({name: functools.partial(fn, x, w, b) for name, fn in fns.items()})
    fwd_bwd = timer({name: functools.partial(forward_backward, fn, x, w, b, dy) for name, fn in fns.items()})
    out = []
    for name in impls:
        err, fwd_ms, fb_ms = errors[name], fwd[name], fwd_bwd[name]
        ok = err <= (1e-3 if dtype == torch.float32 else 0.1)
        fwd_gbps = 2 * rows * C * elem / (fwd_ms * 1e-3) / 1e9
        fb_gbps = 5 * rows * C * elem / (fb_ms * 1e-3) / 1e9
        out.append(
            {
                "impl": name, "rows": rows, "C": C, "dtype": str(dtype).removeprefix("torch."),
                "device": device.type, "max_abs_err_vs_builtin": err, "correct": ok,
                "fwd_ms": fwd_ms, "fwd_bwd_ms": fb_ms, "bwd_ms": fb_ms - fwd_ms,
                "fwd_gbps": fwd_gbps, "fwd_bwd_gbps": fb_gbps, "copy_gbps": gbps_copy,
                "fwd_pct_copy": 100 * fwd_gbps / gbps_copy, "fwd_bwd_pct_copy": 100 * fb_gbps / gbps_copy,
            }
        )
    return out


def table(results: list[dict]) -> str:
    head = (
        "| impl | shape | dtype | fwd ms | fwd GB/s | fwd %copy | fwd+bwd ms | fwd+bwd GB/s | fwd+bwd %copy "
        "| bwd ms | fwd+bwd vs builtin | copy GB/s |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    builtin = {(r["rows"], r["C"], r["dtype"]): r["fwd_bwd_ms"] for r in results if r["impl"] == "builtin"}
    for r in results:
        base = builtin.get((r["rows"], r["C"], r["dtype"]))
        vs = f"{r['fwd_bwd_ms'] / base:.2f}x" if base else "n/a"
        flag = "" if r["correct"] else " (WRONG)"
        lines.append(
            f"| {r['impl']}{flag} | [{r['rows']}, {r['C']}] | {r['dtype']} | {r['fwd_ms']:.3f} | "
            f"{r['fwd_gbps']:.1f} | {r['fwd_pct_copy']:.0f}% | {r['fwd_bwd_ms']:.3f} | {r['fwd_bwd_gbps']:.1f} | "
            f"{r['fwd_bwd_pct_copy']:.0f}% | {r['bwd_ms']:.3f} | {vs} | {r['copy_gbps']:.1f} |"
        )
    return "\n".join(lines)


def targets(results: list[dict]) -> list[dict]:
    """The targets, checked on whatever this run measured. (custom against builtin on the CPU is reported in the
    table, not held to a target: layer_norm is written to be read, not tuned.)"""
    found = {(r["impl"], r["rows"], r["C"], r["dtype"], r["device"]): r for r in results}
    checks = []
    for (impl, rows, C, dt, dev), r in found.items():
        builtin = found.get(("builtin", rows, C, dt, dev))
        naive = found.get(("naive", rows, C, dt, dev))
        if dev == "cpu" and impl == "custom" and naive and (rows, C) == (16384, 384):
            checks.append({"target": "CPU hand backward faster than autograd through the formula [16384, 384]",
                           "dtype": dt, "value": f"{r['bwd_ms']:.2f} ms vs {naive['bwd_ms']:.2f} ms",
                           "ok": r["bwd_ms"] < naive["bwd_ms"]})
        if dev == "cuda" and impl == "triton" and builtin and C >= 1024 and dt == "bfloat16":
            checks.append({"target": f"CUDA triton fwd <= builtin, bf16 [{rows}, {C}]", "dtype": dt,
                           "value": f"{r['fwd_ms']:.3f} vs {builtin['fwd_ms']:.3f} ms",
                           "ok": r["fwd_ms"] <= builtin["fwd_ms"]})
            checks.append({"target": f"CUDA triton fwd+bwd <= builtin, bf16 [{rows}, {C}]", "dtype": dt,
                           "value": f"{r['fwd_bwd_ms']:.3f} vs {builtin['fwd_bwd_ms']:.3f} ms",
                           "ok": r["fwd_bwd_ms"] <= builtin["fwd_bwd_ms"]})
        if dev == "cuda" and impl == "triton" and (rows, C) == (4096 * 8, 4096):
            checks.append({"target": f"CUDA triton fwd >= 80% of copy bandwidth at [32768, 4096] {dt}", "dtype": dt,
                           "value": f"{r['fwd_pct_copy']:.0f}%", "ok": r["fwd_pct_copy"] >= 80})
    return checks


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default=None, help="float32, bfloat16, float16, or a comma list "
                   "(default: float32 on CPU; bfloat16,float32 on CUDA)")
    p.add_argument("--sizes", default=None, help="comma list of C (default: 128,384,768,4096 on CPU; "
                   "768,1024,2048,4096,8192 on CUDA)")
    p.add_argument("--rows", type=int, default=None, help=f"rows = B*T (default {CPU_ROWS} CPU, {CUDA_ROWS} CUDA)")
    p.add_argument("--impls", default=None, help="comma list from custom,builtin,triton,naive (default: all "
                   "that run here; on CUDA naive is left out unless named)")
    p.add_argument("--reps", type=int, default=None, help="timed calls per measurement (median)")
    p.add_argument("--quick", action="store_true", help="small shapes and few reps: a smoke run")
    p.add_argument("--system-malloc", action="store_true", help="keep glibc's default allocator settings (times "
                   "then include page faults; by default the script re-runs itself with glibc keeping freed memory)")
    p.add_argument("--json", type=Path, default=None, help="write the results (and machine, targets) as JSON")
    p.add_argument("--out", type=Path, default=None, help="write the table as Markdown")
    args = p.parse_args(argv)
    if args.rows is not None and args.rows < 1:
        p.error(f"--rows must be >= 1, got {args.rows}")
    if args.reps is not None and args.reps < 1:
        p.error(f"--reps must be >= 1, got {args.reps}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available here; use --device cpu")
    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    cuda = device.type == "cuda"
    try:
        sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else None
    except ValueError:
        raise SystemExit(f"--sizes must be a comma list of integers, got {args.sizes!r}") from None
    if sizes is not None and any(s < 1 for s in sizes):
        raise SystemExit(f"--sizes must be positive, got {args.sizes!r}")
    sizes = sizes or list(QUICK_SIZES if args.quick else CUDA_SIZES if cuda else CPU_SIZES)
    rows = args.rows or (QUICK_ROWS if args.quick else CUDA_ROWS if cuda else CPU_ROWS)
    dtype_names = (args.dtype or ("bfloat16,float32" if cuda else "float32")).split(",")
    for name in dtype_names:
        if name not in DTYPES:
            raise SystemExit(f"unknown --dtype {name!r}; choose from {', '.join(DTYPES)}")
    triton_here = cuda or os.environ.get("TRITON_INTERPRET") == "1"
    if args.impls:
        impls = args.impls.split(",")
        for name in impls:
            impl_fn(name)  # validates
        if "triton" in impls and not triton_here:
            raise SystemExit("triton runs on CUDA, or on the CPU only with TRITON_INTERPRET=1 set (slow): "
                             "leave it out of --impls, or use --device cuda")
    else:
        impls = [i for i in IMPLS if (i != "triton" or triton_here) and (i != "naive" or not cuda)]
    reps = args.reps or (3 if args.quick else 10)
    timer = Timer(device, reps=reps, warmup=2)
    if "triton" in impls and not cuda:
        print("note: triton on the CPU runs in Triton's interpreter: its times say nothing about the kernels")

    info = machine_info()
    info["malloc"] = malloc_mode()
    if cuda:
        info["gpu"] = torch.cuda.get_device_name(device)
    print(f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}, rows {rows}, "
          f"C {sizes}, dtypes {dtype_names}, impls {impls}, reps {reps}, malloc {info['malloc']}")
    report: dict[str, Any] = {"machine": info, "device": device.type, "results": [], "targets": []}

    def save() -> None:
        report["targets"] = targets(report["results"])
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(table(report["results"]) + "\n", encoding="utf-8")

    for dtype_name in dtype_names:
        for C in sizes:
            t0 = time.perf_counter()
            try:
                results = bench_shape(rows, C, DTYPES[dtype_name], device, impls, timer)
            except (torch.cuda.OutOfMemoryError, MemoryError) as e:
                print(f"[{rows}, {C}] {dtype_name}: out of memory ({str(e).splitlines()[0]}); skipped")
                continue
            report["results"] += results
            save()
            for r in results:
                print(f"  {r['impl']:8s} [{rows}, {C}] {dtype_name}: fwd {r['fwd_ms']:.3f} ms "
                      f"({r['fwd_pct_copy']:.0f}% copy), fwd+bwd {r['fwd_bwd_ms']:.3f} ms "
                      f"({r['fwd_bwd_pct_copy']:.0f}% copy){'' if r['correct'] else '  WRONG OUTPUT'}")
            print(f"  ({time.perf_counter() - t0:.1f} s)")
            if cuda:
                torch.cuda.empty_cache()
    print()
    print(table(report["results"]))
    if report["targets"]:
        print()
        for t in report["targets"]:
            print(f"{'PASS' if t['ok'] else 'MISS'}  {t['target']}: {t['value']}")
    if args.quick:
        print("\n(--quick: a smoke run on small shapes; these times are not measurements)")
    if not all(r["correct"] for r in report["results"]):
        print("\nsome implementation's output differs from builtin (WRONG above)")
    return report


if __name__ == "__main__":
    if sys.platform == "linux" and "--system-malloc" not in sys.argv and malloc_mode() == "system default":
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **STEADY_MALLOC})  # see STEADY_MALLOC
    report = main()
    sys.exit(0 if all(r["correct"] for r in report["results"]) else 1)

