"""The Python steps of bench/gpu.sh, and its report.

    python bench/gpu_report.py machine OUT.json                        # nvidia-smi, machine and versions
    python bench/gpu_report.py triton-check SHAPES DEVICE OUT.json     # Triton vs F.layer_norm, judged on float64
    python bench/gpu_report.py swap-norms RUN_DIR DEVICE OUT.json      # one checkpoint, greedy, with every LayerNorm
    python bench/gpu_report.py pack RESULTS_DIR OUT_DIR --commit C ... # summary.md, results.json, gpu_results.tar.gz

`pack` leaves exactly PACKED_FILES in OUT_DIR (tests/test_gpu_sh.py holds bench/gpu.sh --dry-run to that set).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import fmt, machine_info, markdown_table, write_json  # noqa: E402

from checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402

PACKED_FILES = ("summary.md", "results.json", "gpu_results.tar.gz")


def cmd_machine(out: Path) -> int:
    info = machine_info()
    try:
        query = "name,memory.total,clocks.max.sm,clocks.max.mem,power.limit,driver_version"
        smi = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv"], capture_output=True, text=True)
        info["nvidia_smi"] = smi.stdout.strip()
    except FileNotFoundError:
        info["nvidia_smi"] = None  # no NVIDIA driver here (the dry run)
    print(json.dumps(info, indent=2))
    write_json(out, info)
    return 0


def cmd_triton_check(shapes: str, device: str, out: Path) -> int:
    """Forward and the three gradients, fp32 and bf16: each error against float64 at most twice PyTorch's own
    error in that dtype plus a small slack (1e-5 fp32, 1e-2 bf16), relative to the reference's largest entry."""
    from layernorm_triton import layer_norm_triton

    rows = []
    torch.manual_seed(0)
    for n, c in (tuple(int(v) for v in s.split("x")) for s in shapes.split(",")):
        for dtype in (torch.float32, torch.bfloat16):
            x = (torch.randn(n, c, device=device) * 2 + 0.5).to(dtype)
            w = (torch.randn(c, device=device) * 0.1 + 1).to(dtype)
            b = (torch.randn(c, device=device) * 0.1).to(dtype)
            dy = torch.randn(n, c, device=device).to(dtype)

            def run(fn, dt, x=x, w=w, b=b, dy=dy):
                xs, ws, bs = (t.detach().to(dt).requires_grad_() for t in (x, w, b))
                y = fn(xs, ws, bs)
                return [y.detach(), *torch.autograd.grad(y, (xs, ws, bs), dy.to(dt))]

            builtin = lambda a, ww, bb, c=c: F.layer_norm(a, (c,), ww, bb, 1e-5)
            ref, tri, pt = run(builtin, torch.float64), run(layer_norm_triton, dtype), run(builtin, dtype)
            for what, r, t, p in zip(("y", "dx", "dw", "db"), ref, tri, pt, strict=True):
                scale = r.abs().max().item() or 1.0
                err_t = (t.double() - r).abs().max().item() / scale
                err_p = (p.double() - r).abs().max().item() / scale
                ok = err_t <= 2 * err_p + (1e-5 if dtype == torch.float32 else 1e-2)
                rows.append({"shape": [n, c], "dtype": str(dtype)[6:], "what": what, "triton_err": err_t,
                             "builtin_err": err_p, "ok": ok})
                print(f"[{n}, {c}] {str(dtype)[6:]:>8} {what:>2}: triton {err_t:.2e}  builtin {err_p:.2e}  "
                      f"{'ok' if ok else 'FAIL'}")
    write_json(out, rows)
    return 0 if all(r["ok"] for r in rows) else 1


@torch.no_grad()
def cmd_swap_norms(run_dir: Path, device: str, out: Path, tokens: int = 200) -> int:
    """The run's checkpoint, greedy from a newline, with each LayerNorm: the same weights, so the same text?"""
    ckpt = load_checkpoint(run_dir / "ckpt.pt", map_location="cpu")
    result: dict[str, Any] = {"trained_with": ckpt["model_args"].get("norm"), "tokens": tokens, "norms": {}}
    for norm in ("triton", "builtin", "custom"):
        model = model_from_checkpoint(ckpt, norm=norm, device=device)
        start = torch.zeros(1, 1, dtype=torch.long, device=device)  # id 0: the newline of the char vocabulary
        ids = model.generate(start, tokens, temperature=0)[0].tolist()
        result["norms"][norm] = ids
    first = result["norms"]["triton"]
    result["identical"] = {norm: ids == first for norm, ids in result["norms"].items()}
    result["first_difference"] = {
        norm: next((i for i, (a, b) in enumerate(zip(ids, first, strict=True)) if a != b), None)
        for norm, ids in result["norms"].items()
    }
    print(json.dumps({k: v for k, v in result.items() if k != "norms"}, indent=2))
    write_json(out, result)
    return 0


# ----------------------------------------------------------------------------------------------------------------
# pack


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _steps(res: Path) -> list[dict[str, Any]]:
    steps = []
    tsv = res / "steps.tsv"
    for line in tsv.read_text().splitlines() if tsv.exists() else []:
        name, rc, seconds, limit = line.split("\t")
        steps.append({"step": name, "rc": rc, "seconds": int(seconds), "limit_s": int(limit)})
    return steps


def _last_line(path: Path) -> str:
    lines = [s for s in path.read_text(errors="replace").splitlines() if s.strip()] if path.exists() else []
    return lines[-1] if lines else "(no output)"


def summary_markdown(results: dict[str, Any], res: Path) -> str:
    machine = results.get("machine") or {}
    dry = ", dry run on the CPU" if results["dry_run"] else ""
    lines = [f"# bench/gpu.sh results (commit {results['commit']}{dry})", "",
             f"Machine: {machine.get('gpu') or 'no GPU'}; torch {machine.get('torch')}, triton {machine.get('triton')}."
             f" Total {results['elapsed_s']} s of a {results['budget_s']} s budget.", "",
             markdown_table(["step", "exit", "seconds", "limit s"],
                            [[s["step"], s["rc"], s["seconds"], s["limit_s"]] for s in results["steps"]])]
    check = results.get("triton_check")
    if check:
        failed = [r for r in check if not r["ok"]]
        lines += ["", f"Triton check: {len(check) - len(failed)} of {len(check)} comparisons within tolerance"
                  + (f"; failed: {[(r['shape'], r['dtype'], r['what']) for r in failed]}" if failed else ".")]
    train = (results.get("train_report") or {}).get("report", {}).get("runs")
    if train:
        lines += ["", markdown_table(
            ["run", "norm", "iters", "ms/iter (median)", "tokens/s", "final val loss", "best val loss", "wall s"],
            [[Path(r["run"]).name, r.get("norm"), r.get("iters"), fmt(r.get("ms_per_iter")),
              fmt(r.get("tokens_per_s"), ".0f"), fmt(r.get("final_val_loss"), ".4f"),
              fmt(r.get("best_val_loss"), ".4f"), fmt(r.get("wall_s"), ".1f")]
             for r in train])]
    swap = results.get("swap_norms")
    if swap:
        lines += ["", f"Checkpoint trained with {swap['trained_with']}, {swap['tokens']} greedy tokens: identical "
                  f"to triton's: {swap['identical']} (first difference at {swap['first_difference']})"]
    bench_md = res / "bench_layernorm.md"
    if bench_md.exists():
        lines += ["", "## bench/bench_layernorm.py", "", bench_md.read_text().strip()]
    overhead = results.get("overhead")
    if overhead:
        lines += ["", "## bench/triton_overhead.py", "", overhead.get("table", "")]
    lines += ["", f"Tests: {_last_line(res / 'tests.log')}", ""]
    return "\n".join(lines)


def cmd_pack(res: Path, out: Path, args: argparse.Namespace) -> int:
    results: dict[str, Any] = {"commit": args.commit, "dry_run": args.dry_run == "1", "budget_s": args.budget,
                               "elapsed_s": args.elapsed, "steps": _steps(res)}
    for name in ("machine", "triton_check", "train_report", "swap_norms", "bench_layernorm", "overhead"):
        results[name] = _read_json(res / f"{name}.json")
    write_json(out / "results.json", results)
    (out / "summary.md").write_text(summary_markdown(results, res), encoding="utf-8")
    with tarfile.open(out / "gpu_results.tar.gz", "w:gz") as tar:
        tar.add(res, arcname="gpu_results")
    print(f"packed {', '.join(PACKED_FILES)} into {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("machine").add_argument("out", type=Path)
    t = sub.add_parser("triton-check")
    s = sub.add_parser("swap-norms")
    for q, first in ((t, "shapes"), (s, "run_dir")):
        q.add_argument(first)
        q.add_argument("device")
        q.add_argument("out", type=Path)
    k = sub.add_parser("pack")
    k.add_argument("res", type=Path)
    k.add_argument("out", type=Path)
    for flag in ("--commit", "--dry-run", "--budget", "--elapsed"):
        k.add_argument(flag, default="")
    args = p.parse_args(argv)
    if args.command == "machine":
        return cmd_machine(args.out)
    if args.command == "triton-check":
        return cmd_triton_check(args.shapes, args.device, args.out)
    if args.command == "swap-norms":
        return cmd_swap_norms(Path(args.run_dir), args.device, args.out)
    return cmd_pack(args.res, args.out, args)


if __name__ == "__main__":
    sys.exit(main())
