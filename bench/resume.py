"""Does a resumed run continue the run it was cut from? 2 + 2 iterations of train.py, the second two resumed from
the first two's checkpoint, against 4 straight, every other option the same; exits 1 if they differ (bench/README.md).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import at_least, fmt, parse, parser, report, run_child
from machinery.command import Failure, run_command
from machinery.measure import markdown_table
from machinery.runlog import read_metrics

ITERS = 4
CUT = 2


def logged(out_dir: Path) -> dict[tuple[str, int], float]:
    """{(kind, iter): loss}: every training loss and val loss in out_dir's metrics.jsonl."""
    records = [r for r in read_metrics(out_dir / "metrics.jsonl") if r["kind"] in ("train", "eval")]
    return {(r["kind"], r["iter"]): r["loss"] if r["kind"] == "train" else r["val_loss"] for r in records}


def compare(straight: Path, resumed: Path, rtol: float) -> dict[str, Any]:
    """The two runs' logged losses side by side, their largest relative gap, the final weights' largest gap."""
    from machinery.checkpoint import load_checkpoint

    a = logged(straight)
    b = logged(resumed)
    rows = [[kind, it, a[kind, it], b.get((kind, it))] for kind, it in sorted(a)]
    gaps = [abs(x - y) / abs(x) if y is not None else float("inf") for _, _, x, y in rows]
    gap = max(gaps, default=float("inf"))
    wa = load_checkpoint(straight / "ckpt.pt")["model"]
    wb = load_checkpoint(resumed / "ckpt.pt")["model"]
    weights = max((wa[k].double() - wb[k].double()).abs().max().item() for k in wa)
    return {"losses": rows, "max_relative_loss_gap": gap, "max_weight_gap": weights, "rtol": rtol, "same": gap <= rtol}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__, config=True)
    p.add_argument(
        "--rtol", type=at_least(0.0, float), default=0.0, help="the losses' largest relative gap allowed (default 0)"
    )
    args = parse(p, argv)
    flags = [args.config, f"--device={args.device}", *(f"--{item}" for item in args.set)]  # --set device=X wins
    # Both runs evaluate at CUT, where the first part stops, so both draw alike.
    flags += [f"--eval_interval={CUT}", "--log_interval=1", "--sample_at_end=False"]
    with tempfile.TemporaryDirectory(prefix="bench_resume_") as work:
        straight = Path(work, "straight")
        resumed = Path(work, "resumed")
        for cmd in (  # the resumed run as a user resumes one: its options are the checkpoint's
            [*flags, f"--out_dir={straight}", f"--max_iters={ITERS}"],
            [*flags, f"--out_dir={resumed}", f"--max_iters={CUT}"],
            ["--init_from=resume", f"--out_dir={resumed}", f"--max_iters={ITERS}"],
        ):
            child = run_child([sys.executable, "train.py", *cmd])
            print(f"train.py {' '.join(cmd)}: exit {child.returncode}", flush=True)
            if child.interrupted:  # (Ctrl-C: run_command says so)
                raise KeyboardInterrupt
            if not child.ok:
                raise Failure(f"train.py {' '.join(cmd)} failed: {' | '.join(child.lines[-5:])}")
        result = {"flags": flags, **compare(straight, resumed, args.rtol)}
    title = f"### {CUT} + {ITERS - CUT} iterations resumed against {ITERS} straight: {' '.join(flags[1:])}"
    verdict = "the same run" if result["same"] else "NOT the same run"
    gaps = (
        f"Largest relative loss gap {result['max_relative_loss_gap']:.1e} (allowed {args.rtol:g}); final weights'"
        f" largest gap {result['max_weight_gap']:.1e}: {verdict}."
    )
    cells = [[k, i, fmt(x, ".7f"), fmt(y, ".7f")] for k, i, x, y in result["losses"]]
    text = f"{title}\n\n{gaps}\n\n{markdown_table(['logged', 'iter', 'straight', 'resumed'], cells)}"
    return report(args, "bench.resume", result, text)


if __name__ == "__main__":
    sys.exit(run_command(lambda: 0 if main()["same"] else 1, "the model's size (--set n_layer=..., --set n_embd=...)"))
