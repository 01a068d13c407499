"""python -m exercises [N]: grade every exercise, or exercise N, and print PASS or the first mistake for each.

Exit status: 0 when every exercise graded passes (one that cannot run here, the Triton one without triton, is
skipped, saying why), 1 otherwise, 2 for an N that is not an exercise.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

from exercises import check

FILES = {
    1: "ex1_layer_norm_1d",
    2: "ex2_layer_norm",
    3: "ex3_variance",
    4: "ex4_backward",
    5: "ex5_triton_forward",
    6: "ex6_per_token",
    7: "ex7_rms_norm",
}


def grade(n: int, package: str = "exercises") -> str:
    """Exercise n of package (the learner's, or exercises.solutions) graded: PASS or the first mistake."""
    if n in check.TRITON_EXERCISES and (why := check.triton_unavailable()) is not None:
        return f"{check.SKIPPED}: {why}"
    try:
        module = importlib.import_module(f"{package}.{FILES[n]}")
    except Exception as error:  # a syntax error in the learner's file, say: one line, no traceback
        return f"{FILES[n]}.py does not import: {check.in_one_line(error, None)}"
    return check.CHECKS[n](module)


def main(argv: Sequence[str] | None = None, package: str = "exercises") -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    valid = [str(n) for n in FILES]
    if len(args) > 1 or (args and args[0] not in valid):
        print(f"usage: python -m exercises [N], N one of {', '.join(valid)}; got {' '.join(args)}", file=sys.stderr)
        return 2
    chosen = [int(args[0])] if args else list(FILES)
    failed = 0
    for n in chosen:
        result = grade(n, package)
        print(f"exercise {n} ({FILES[n]}.py): {result}", flush=True)
        failed += result != check.PASS and not result.startswith(check.SKIPPED)
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: exercise 5 runs on the CPU
    sys.exit(main())
