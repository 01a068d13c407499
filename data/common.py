"""Prepared data (data/README.md: train.bin, val.bin and meta.json), written by the ``data/*/prepare.py`` scripts:
find the text, check it, split 90/10, tokenize, write (run_prepare). train.py reads it back through
machinery/dataset.py."""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import http.client
import json
import os
import ssl
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from machinery.command import ArgumentParser, Failure, run_command

ROOT = Path(__file__).resolve().parents[1]
TINY_SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
TRAIN_FRACTION = 0.9
MIN_SPLIT_TOKENS = 2  # the least a split can hold and still give one (input, target) pair
UINT16_IDS = 2**16  # np.uint16 holds token ids 0..65535, so at most 65,536 distinct tokens
DOWNLOAD_TIMEOUT_S = 30.0
# what a failed download adds when the reason is CERTIFICATE_VERIFY_FAILED (ssl.SSLCertVerificationError)
CERTIFICATE_FIX = (
    "This Python cannot verify the site's certificate (python.org's Python for macOS has no certificates until its "
    f'"Install Certificates.command" has run): to fix, open "/Applications/Python {sys.version_info.major}.'
    f'{sys.version_info.minor}/Install Certificates.command" and run this again. '
)


def decode_text(data: bytes, name: str) -> str:
    """UTF-8 bytes -> text (newlines as they are: no universal-newline translation), refusing empty and binary."""
    nul = data.find(b"\x00")
    if nul != -1:
        raise Failure(f"{name} looks binary (NUL byte at byte offset {nul}); give a UTF-8 text file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Failure(
            f"{name} is not UTF-8 text (byte 0x{data[e.start]:02x} at byte offset {e.start} is invalid); "
            f"convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8) or give a text file"
        ) from None
    text = text.removeprefix("\ufeff")  # a byte-order mark (some Windows editors add one) is not text
    if not text:
        raise Failure(
            f"{name} holds no text (it is empty, or a byte-order mark alone); give a UTF-8 text file with some "
            f"text in it"
        )
    return text


def read_text_file(path: Path) -> str:
    # a device (/dev/zero would fill the memory), a named pipe or a socket (a read that waits for a writer, maybe for
    # ever); a folder or a missing file: the OSError below
    if path.exists() and not path.is_file() and not path.is_dir():
        raise Failure(f"{path} is not a regular file (a device, a named pipe or a socket): give a file saved on disk")
    try:
        data = path.read_bytes()
    except OSError as e:  # no such file, a directory, no permission
        raise Failure(f"cannot read {path}: {e.strerror or e}; give the path of a UTF-8 text file") from None
    except MemoryError:
        raise Failure(f"{path} is too large to read into memory here; give a smaller text") from None
    return decode_text(data, str(path))


def write_atomic(folder: Path, files: dict[str, bytes]) -> None:
    """Write `files` (name -> bytes) into `folder` as one set: each goes to a temporary file beside it and to disk
    first; only then are they renamed into place, in order, after the old meta.json (if meta.json is among them, give
    it last) is removed. A kill or a full disk at any moment leaves the old set, or a set without meta.json, which
    PreparedData refuses: never a mix that loads. A write that fails (a full disk, no permission) is a Failure naming
    the folder."""
    written = {}
    try:
        for name, data in files.items():
            for stale in folder.glob(f"{glob.escape(name)}.{'[a-z0-9_]' * 8}.tmp"):  # what a killed write left
                with contextlib.suppress(OSError):  # (mkstemp's names; one another process holds on Windows)
                    stale.unlink()
            fd, tmp = tempfile.mkstemp(prefix=name + ".", suffix=".tmp", dir=folder)
            written[name] = Path(tmp)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        if "meta.json" in files:
            (folder / "meta.json").unlink(missing_ok=True)
        for name, tmp in written.items():
            os.replace(tmp, folder / name)
    except OSError as e:
        raise Failure(
            f"cannot write {', '.join(files)} to {folder}: {e.strerror or e}; run this again once that is fixed"
        ) from None
    finally:
        for tmp in written.values():
            tmp.unlink(missing_ok=True)


def read_text_source(input_path: Path | None, out_dir: Path, url: str, script: str) -> tuple[str, str]:
    """The text to prepare and a name for it, from where data/README.md says; else fails saying how to supply it."""
    local = out_dir / "input.txt"
    if input_path is not None or local.exists():  # --input, else the text saved (or downloaded) there before
        path = input_path or local
        return read_text_file(path), str(path)
    print(f"{local} not found; downloading {url}")
    try:  # besides OSError: ValueError for a malformed URL, HTTPException for a broken or truncated response
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
            data = response.read()
    except (OSError, ValueError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", None) or e
        raise Failure(
            f"no input text: no --input, no {local}, and downloading {url} failed ({reason}). "
            f"{CERTIFICATE_FIX if isinstance(reason, ssl.SSLCertVerificationError) else ''}"
            f"Supply the file: python {script} --input path/to/tinyshakespeare.txt (or save it as {local})"
        ) from None
    text = decode_text(data, url)
    write_atomic(out_dir, {"input.txt": data})
    print(f"saved {len(data):,} bytes to {local}")
    return text, str(local)


def split_text(text: str, train_fraction: float = TRAIN_FRACTION) -> tuple[str, str]:
    """Split by characters, as nanoGPT does: the first ``int(n * train_fraction)`` characters are train."""
    n = int(len(text) * train_fraction)
    return text[:n], text[n:]


def run_prepare(
    argv: Sequence[str] | None, *, description: str | None, script_file: str, make_tokenizer: Callable[[str], Any]
) -> int:
    """The whole prepare script, through the front door (its exit status): args, text, tokenizer
    (``make_tokenizer(text)``: see machinery/tokenizer.py; a ValueError or RuntimeError it raises is the message),
    90/10 split, files."""
    script_dir = Path(script_file).resolve().parent
    parser = ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", type=Path, help="a UTF-8 text file (default: <out_dir>/input.txt, else downloaded)")
    where = f"where train.bin, val.bin and meta.json go (default: {script_dir.relative_to(ROOT)})"
    parser.add_argument("--out_dir", type=Path, default=script_dir, help=where)
    url = "where input.txt is downloaded from, without --input or input.txt (default: the canonical Tiny Shakespeare)"
    parser.add_argument("--url", default=TINY_SHAKESPEARE_URL, help=url)
    script = str(Path(script_file).resolve().relative_to(ROOT))

    # A bad argument is a BadOption: one line, exit 2. Ctrl-C: write_atomic leaves the folder as it was, or without
    # meta.json: never half a set
    return run_command(
        lambda: prepare(parser.parse_args(argv), script, make_tokenizer),
        "the text's size",
        "interrupted: no half-written file is left in the output folder; run this again to prepare it",
    )


def prepare(args: argparse.Namespace, script: str, make_tokenizer: Callable[[str], Any]) -> None:
    """run_prepare's work, once its arguments (--input, --out_dir, --url) are read."""
    out_dir = args.out_dir
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file in its path, no permission
        raise Failure(f"cannot create --out_dir {out_dir}: {e.strerror or e}; give a folder you can write to") from None
    text, source = read_text_source(args.input, out_dir, args.url, script)
    try:
        tok = make_tokenizer(text)
    except (ValueError, RuntimeError) as e:
        raise Failure(str(e)) from None
    if tok.vocab_size > UINT16_IDS:  # every id is below vocab_size (a char vocabulary: the distinct characters)
        raise Failure(
            f"{source} has {tok.vocab_size:,} distinct characters, more than the {UINT16_IDS:,} token ids "
            f"(0..{UINT16_IDS - 1}) that np.uint16 train.bin/val.bin can hold; use the BPE tokenizer "
            f"(data/shakespeare/prepare.py) for this text"
        )
    parts = split_text(text)
    ids = [np.asarray(tok.encode(part), dtype=np.int64) for part in parts]
    n_train, n_val = (int(a.size) for a in ids)
    if min(n_train, n_val) < MIN_SPLIT_TOKENS:
        raise Failure(
            f"{source} is too short: {n_train + n_val:,} tokens give {n_train:,} train and "
            f"{n_val:,} val tokens, and each split needs at least {MIN_SPLIT_TOKENS} "
            f"(train.py further needs more than block_size tokens in each); give a longer text"
        )
    train_bin, val_bin = (a.astype(np.uint16).tobytes() for a in ids)
    meta = {
        "vocab_size": tok.vocab_size,
        "tokenizer": tok.meta,
        "train_tokens": n_train,
        "val_tokens": n_val,
        "train_bytes": len(parts[0].encode("utf-8")),  # for bits per byte (PreparedData.bits_per_byte)
        "val_bytes": len(parts[1].encode("utf-8")),
        "train_sha256": hashlib.sha256(train_bin).hexdigest(),  # PreparedData checks each file against its sha256
        "val_sha256": hashlib.sha256(val_bin).hexdigest(),  # when it opens the data
    }
    # ensure_ascii=False keeps the characters readable; the file is written as UTF-8 on every platform.
    write_atomic(
        out_dir,
        {
            "train.bin": train_bin,
            "val.bin": val_bin,
            "meta.json": (json.dumps(meta, ensure_ascii=False) + "\n").encode("utf-8"),
        },
    )

    try:
        print(f"source: {source} ({len(text):,} characters)")
        print(f"tokenizer: {meta['tokenizer']['kind']}, vocab size {tok.vocab_size:,}")
        print(f"train: {n_train:,} tokens, val: {n_val:,} tokens")
        print(f"wrote {out_dir / 'train.bin'}, {out_dir / 'val.bin'}, {out_dir / 'meta.json'}", flush=True)
    except OSError as e:  # stdout on a full disk, or closed
        raise Failure(f"the prepared files are written, but the report cannot be printed ({e.strerror or e})") from None
