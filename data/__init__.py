"""Datasets: each folder's prepare.py writes train.bin, val.bin and meta.json (shared logic: common.py)."""
