"""python -m exercises [N]: grade every exercise, or exercise N, and print PASS or the first mistake for each.

Exits 0 when every graded exercise passes, 1 otherwise, 2 for an N that is not an exercise.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from exercises.check import CHECKS, PASS

FILES = {
    1: "ex1_layer_norm",
    2: "ex2_layer_norm_1d",
    3: "ex3_backward",
    4: "ex4_rms_norm",
    5: "ex5_per_token",
    6: "ex6_variance",
}


def grade(n: int, package: str = "exercises") -> str:
    """Exercise n of package (the learner's, or exercises.solutions) graded: PASS or the first mistake."""
    try:
        module = importlib.import_module(f"{package}.{FILES[n]}")
    except Exception as error:  # a syntax error in the learner's file, say: one line, no traceback
        return f"{FILES[n]}.py does not import: {type(error).__name__}: {' '.join(str(error).split())}"
    return CHECKS[n](module)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    valid = [str(n) for n in FILES]
    if len(args) > 1 or (args and args[0] not in valid):
        print(f"usage: python -m exercises [N], N one of {', '.join(valid)}; got {' '.join(args)}", file=sys.stderr)
        return 2
    chosen = [int(args[0])] if args else list(FILES)
    results = {n: grade(n) for n in chosen}
    for n, result in results.items():
        print(f"exercise {n} ({FILES[n]}.py): {result}")
    return 0 if all(r == PASS for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
