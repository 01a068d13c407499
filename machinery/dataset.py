"""A prepared dataset read back for training (data/README.md: train.bin, val.bin, meta.json, written by the
``data/*/prepare.py`` scripts): checked against its meta.json once, then read window by window."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from machinery.command import Failure

ROOT = Path(__file__).resolve().parents[1]


class DataError(Failure, RuntimeError):
    """A prepared dataset that is missing or unusable; the message says how to prepare it."""


def read_ids(path: Path, chunk_bytes: int = 1 << 24) -> tuple[int, str]:
    """The largest token id in a .bin file of np.uint16 ids and the sha256 of its bytes, in one pass over it."""
    largest, digest = 0, hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            digest.update(chunk)
            largest = max(largest, int(np.frombuffer(chunk, dtype=np.uint16).max()))
    return largest, digest.hexdigest()


class PreparedData:
    """train.bin / val.bin and meta.json of one prepared dataset: data_dir, else data/<dataset>/. Windows are read
    with a seek and a read each, from files opened once: a memmap kept open would keep every page it touched
    resident, and opening one per batch, as nanoGPT does, costs ~4x more."""

    def __init__(self, data_dir: str | None, dataset: str, block_size: int) -> None:
        self.dir = Path(data_dir) if data_dir else ROOT / "data" / dataset
        self.block_size = block_size
        prepare = ROOT / "data" / dataset / "prepare.py"
        if prepare.is_file():
            out_dir = "" if self.dir == ROOT / "data" / dataset else f" --out_dir {self.dir}"
            how = f"run `python {prepare.relative_to(ROOT)}{out_dir}` first"
        else:
            how = "write train.bin, val.bin (np.uint16 token ids) and meta.json there (see data/README.md)"
        if self.dir.is_file():
            raise DataError(
                f"data_dir {str(self.dir)!r} is a file: give the folder holding train.bin, val.bin, meta.json"
            )
        for name in ("train.bin", "val.bin", "meta.json"):
            if not (self.dir / name).is_file():
                raise DataError(f"no {name} in {self.dir} (dataset {dataset!r}): {how}")
        meta_path = self.dir / "meta.json"
        try:
            self.meta = json.loads(meta_path.read_text(encoding="utf-8"))
            self.vocab_size = vocab = self.meta["vocab_size"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise DataError(f"{meta_path} is unreadable or has no vocab_size ({e}): {how}") from None
        for key in ("vocab_size", "train_tokens", "val_tokens", "train_bytes", "val_bytes"):  # (the counts may be
            # absent, in a dataset written by hand)
            value = self.meta.get(key, 1)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DataError(f"{meta_path} has {key}={value!r}: it must be a positive integer; {how}")
        self.tokens: dict[str, int] = {}
        for split in ("train", "val"):  # each file against what meta.json records of it (a dataset written by hand
            path = self.dir / f"{split}.bin"  # may record no counts nor sha256: those are not compared)
            size = path.stat().st_size
            n = self.tokens[split] = size // 2
            n_bytes, recorded = self.meta.get(f"{split}_bytes"), self.meta.get(f"{split}_tokens")
            if n_bytes is not None and recorded is not None and n_bytes < recorded:  # a token is at least one byte
                raise DataError(
                    f"{meta_path} has {split}_bytes={n_bytes} for {split}_tokens={recorded}: each token is at least "
                    f"one byte of text (a character, a BPE piece), so bits per byte would be wrong; {how}"
                )
            if size % 2 or (recorded is not None and recorded != n):
                raise DataError(
                    f"{path} holds {size:,} bytes, but {meta_path} records {recorded} tokens of 2 bytes: it was cut "
                    f"short or replaced (an interrupted copy or prepare); {how}"
                )
            if n <= block_size:
                raise DataError(
                    f"{split}.bin in {self.dir} has {n} tokens but block_size is {block_size}: a window needs "
                    f"block_size + 1 = {block_size + 1} tokens (input and shifted target); use more text or a "
                    f"smaller --block_size"
                )
            largest, digest = read_ids(path)
            if self.meta.get(f"{split}_sha256") not in (None, digest):
                raise DataError(
                    f"{path} is not the file prepared with {meta_path}: its sha256 is not the {split}_sha256 recorded "
                    f"there (changed on disk or in a copy); {how}"
                )
            if largest >= vocab:
                raise DataError(
                    f"{path} holds token id {largest}, but {meta_path} has vocab_size={vocab}: the files do not "
                    f"belong together; {how}"
                )
        itos = self.meta.get("tokenizer", {}).get("itos") if isinstance(self.meta.get("tokenizer"), dict) else None
        if isinstance(itos, list) and len(itos) != vocab:  # a char vocabulary: one id a character, no more, no less
            raise DataError(
                f"{meta_path} has vocab_size={vocab} but its tokenizer lists {len(itos)} characters: the two must "
                f"agree; {how}"
            )
        self._files: dict[str, Any] = {}  # opened at first use

    def bits_per_byte(self, split: str, loss: float) -> float | None:
        """A loss in nats per token as bits per byte of the split's UTF-8 text, loss / ln 2 * tokens / bytes: one
        scale for models with other tokenizers on one text. None where meta.json records no byte count."""
        n_bytes = self.meta.get(f"{split}_bytes")
        return loss / math.log(2) * self.tokens[split] / n_bytes if n_bytes else None

    def describe(self) -> str:
        return (
            f"data {self.dir}: {self.tokens['train']:,} train / {self.tokens['val']:,} val tokens, "
            f"vocab {self.vocab_size}"
        )

    def tokenizer(self) -> Any:
        """The dataset's tokenizer (machinery/tokenizer.py, from meta.json); DataError if it cannot be built here."""
        from machinery.tokenizer import tokenizer_from_meta  # only here: reading batches never needs tiktoken

        try:
            return tokenizer_from_meta(self.meta["tokenizer"])
        except (KeyError, TypeError, ValueError, ImportError, RuntimeError) as e:
            raise DataError(f"the dataset's tokenizer cannot be built here ({e})") from None

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files = {}

    def num_starts(self, split: str) -> int:
        """How many window start positions the split has (0 .. n - block_size - 1)."""
        return self.tokens[split] - self.block_size

    def get(self, split: str, starts: Any, device: str) -> tuple[Any, Any]:
        """Windows at `starts` (an int tensor of any shape S) -> inputs and targets [*S, block_size] on `device`."""
        import torch  # only here: the prepare scripts never need it

        if split not in self._files:
            self._files[split] = open(self.dir / f"{split}.bin", "rb", buffering=0)  # close() closes it
        f = self._files[split]
        raw = bytearray()
        for i in starts.view(-1).tolist():
            f.seek(2 * i)
            raw += f.read(2 * (self.block_size + 1))
        if len(raw) != 2 * (self.block_size + 1) * starts.numel():
            raise DataError(f"{self.dir / f'{split}.bin'} was cut short while this run read it: prepare it again")
        windows = np.frombuffer(raw, dtype=np.uint16).reshape(*starts.shape, self.block_size + 1)
        x = torch.from_numpy(windows[..., :-1].astype(np.int64))
        y = torch.from_numpy(windows[..., 1:].astype(np.int64))
        if device.startswith("cuda"):  # from pinned memory the copy runs while the GPU works
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x.to(device), y.to(device)
