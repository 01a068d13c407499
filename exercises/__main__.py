"""python -m exercises [N] [--explain]: grade every exercise, or exercise N, and print PASS or the first mistake for
each; with --explain, print what the checker tries instead.

Exit status: 0 when every exercise graded passes (one that cannot run here, the Triton one without triton, is
skipped, saying why), 1 otherwise, 2 for an argument that is not an exercise or --explain, 130 when grading is
interrupted (Ctrl-C, or a KeyboardInterrupt raised by an exercise).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

try:
    from exercises import check
except KeyboardInterrupt:  # Ctrl-C while torch is imported, before any grading
    print("interrupted before grading began", file=sys.stderr)
    sys.exit(130)

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
    except SystemExit as stop:
        return f"{FILES[n]}.py calls sys.exit({stop.code!r}) when it is imported: remove it; the grader calls your code"
    except Exception as error:  # a syntax error in the learner's file, say: one line, no traceback
        return f"{FILES[n]}.py does not import: {check.in_one_line(error)}"
    return check.CHECKS[n](module)


def main(argv: Sequence[str] | None = None, package: str = "exercises") -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    explain = "--explain" in args
    numbers = [a for a in args if a != "--explain"]
    valid = [str(n) for n in FILES]
    if len(numbers) > 1 or (numbers and numbers[0] not in valid) or args.count("--explain") > 1:
        print(
            f"usage: python -m exercises [N] [--explain], N one of {', '.join(valid)}; got {' '.join(args)}",
            file=sys.stderr,
        )
        return 2
    chosen = [int(numbers[0])] if numbers else list(FILES)
    if explain:
        for n in chosen:
            print(f"exercise {n} ({FILES[n]}.py): {check.explain(n)}")
        return 0
    failed = 0
    for n in chosen:
        try:
            result = grade(n, package)
        except KeyboardInterrupt:
            why = "interrupted (Ctrl-C, or a KeyboardInterrupt raised by your code): not graded"
            print(f"exercise {n} ({FILES[n]}.py): {why}", flush=True)
            return 130
        print(f"exercise {n} ({FILES[n]}.py): {result}", flush=True)
        failed += result != check.PASS and not result.startswith(check.SKIPPED)
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: exercise 5 runs on the CPU
    try:
        sys.exit(main())
    except OSError as e:  # stdout on a full disk, or closed
        sys.exit(f"error: the results cannot be printed ({e.strerror or e})")
