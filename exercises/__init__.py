"""Exercises: LayerNorm written by you, one file each, graded by `python -m exercises` (check.py).

Edit exN_*.py, replacing each `raise NotImplementedError` with your code; `python -m exercises N` grades one.
solutions/ holds reference solutions, for after you have tried.
"""
