"""Draw batch_independence.py's JSON: per decoding step, how far a prompt decoded alone is from the same prompt
decoded in a batch, for each norm, with PyTorch's kernels and in the batch-invariant mode (bench/README.md).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from machinery.command import ArgumentParser, Failure, run_command

ZERO = 1e-9  # a difference of exactly 0 is drawn here, on the axis labelled "0" (a log scale has no 0)
RESULT = Path("bench/results/batch_independence_cpu.json")  # the figure README.md and docs/03 show
FORMATS = (".png", ".svg", ".pdf")
WORLDS = {"rows": "PyTorch's kernels", "batch_invariant_rows": "batch-invariant mode"}


class NotFinite(ValueError):
    """A difference in the JSON that cannot be drawn: NaN or inf."""


def plot(result: dict, out: Path) -> None:
    from matplotlib.figure import Figure

    worlds = [w for w in WORLDS if w in result]
    fig = Figure(figsize=(5.5 * len(worlds), 4))
    axes = fig.subplots(1, len(worlds), sharey=True, squeeze=False)
    for ax, world in zip(axes[0], worlds, strict=True):
        for row in result[world]:
            steps = row["alone_vs_batch"]["per_step_max_abs_diff"]
            bad = [(i, d) for i, d in enumerate(steps) if not math.isfinite(d)]
            if bad:  # drawn, it would be a gap in the line that no reader sees
                raise NotFinite(
                    f"{world}, {row['name']}: a difference that is not finite ({bad[0][1]} at step {bad[0][0]})"
                )
            style = "--" if not row["required"] else "-"
            label = f"{row['name']} ({row['statistics']})"
            ax.plot(range(len(steps)), [max(d, ZERO) for d in steps], style, label=label)
        ax.set(yscale="log", ylim=(ZERO / 3, 100), title=WORLDS[world], xlabel="decoding step")
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].set_yticks([ZERO, 1e-6, 1e-3, 1, 100], ["0", "1e-6", "1e-3", "1", "100"])
    axes[0][0].set_ylabel("max |logit difference|, alone vs in a batch")
    axes[0][-1].legend(fontsize=8, loc="center right")
    m = result["model"]
    source = "a trained checkpoint" if result["source"].startswith("checkpoint") else "a random model"
    title = f"{source}: {m['n_layer']} layers, {m['n_embd']} wide; {result['dtype']}; {result['new_tokens']} greedy"
    fig.suptitle(f"{title} tokens; a batch of {result['batch_size']} prompts", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--json", type=Path, default=RESULT, help=f"batch_independence.py's JSON (default {RESULT})")
    p.add_argument("--out", type=Path, help="the figure, .png, .svg or .pdf (default: the PNG beside --json)")
    args = p.parse_args(argv)
    out = args.out or args.json.with_suffix(".png")
    if out.is_dir():
        raise Failure(f"--out {out} is a folder: give a file name, such as {out / 'batch_independence.png'}")
    if out.suffix.lower() not in FORMATS:  # (without one, matplotlib would add .png to the name given)
        raise Failure(f"--out {out}: give a file name ending in {', '.join(FORMATS)}")
    try:
        result = json.loads(args.json.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # missing, unreadable, not UTF-8, not JSON
        raise Failure(f"--json {args.json}: {getattr(e, 'strerror', None) or e}") from None
    try:
        plot(result, out)
    except NotFinite as e:
        raise Failure(f"--json {args.json}: {e}; nothing drawn: run batch_independence.py again") from None
    except (KeyError, TypeError, IndexError, ValueError, AttributeError) as e:  # another JSON
        raise Failure(f"--json {args.json} is not batch_independence.py --json's output ({e!r})") from None
    except OSError as e:
        raise Failure(f"--out {out}: {e.strerror or e}") from None
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(run_command(main))
