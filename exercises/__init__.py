"""Exercises: LayerNorm written by you, one file each, graded by `python -m exercises` (check.py).

Edit exN_*.py, replacing each `raise NotImplementedError` with your code; `python -m exercises N` grades one, and
`python -m exercises N --explain` lists the cases its checker tries.
In the chapters' order: 1 to 4 follow docs/01, 5 docs/02 (Triton, skipped without triton), 6 and 8 docs/03, 7
docs/04.
solutions/ holds reference solutions, for after you have tried.
"""
