"""Data preparation and tokenizers: exact Tiny Shakespeare token counts, round trips, and every bad-input error.

The prepare scripts run as subprocesses from a temporary working directory (as a user would run them, from
anywhere), always with --out_dir in a temporary folder: the tests never write into the repository's data folders.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from data.common import UINT16_IDS, read_text_file, split_text
from helpers import NO_DOWNLOADS, ROOT, assert_one_line_error, make_dataset, python
from machinery.command import Failure
from machinery.dataset import DataError, PreparedData
from machinery.tokenizer import CharTokenizer, TiktokenTokenizer, tokenizer_from_meta

CHAR = ROOT / "data" / "shakespeare_char" / "prepare.py"
BPE = ROOT / "data" / "shakespeare" / "prepare.py"
BAD_URL = "file:///nonexistent-dir-for-tests/input.txt"  # a download that fails at once, offline or not


def load_bin(path: Path) -> np.ndarray:
    return np.fromfile(path, dtype=np.uint16)


def write_bytes(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


# --- the real Tiny Shakespeare -------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "tokens"), [(CHAR, (1_003_854, 111_540)), (BPE, (301_966, 36_059))], ids=["char", "bpe"]
)
def test_prepare_tiny_shakespeare(shakespeare_path: Path, tmp_path: Path, script: Path, tokens: tuple[int, int]):
    out = tmp_path / "out"
    proc = python(script, "--input", shakespeare_path, "--out_dir", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"{tokens[0]:,}" in proc.stdout and f"{tokens[1]:,}" in proc.stdout
    meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
    if script == CHAR:
        itos = meta["tokenizer"]["itos"]
        assert meta["vocab_size"] == len(itos) == 65 and meta["tokenizer"]["kind"] == "char" and itos == sorted(itos)
    else:
        assert meta["vocab_size"] == 50257 and meta["tokenizer"] == {"kind": "tiktoken", "encoding": "r50k_base"}
    train, val = load_bin(out / "train.bin"), load_bin(out / "val.bin")
    assert (train.size, val.size) == tokens == (meta["train_tokens"], meta["val_tokens"])
    # Split by characters first (as nanoGPT does), so each part decodes back to its own characters.
    train_text, val_text = split_text(shakespeare_path.read_bytes().decode("utf-8"))
    assert (meta["train_bytes"], meta["val_bytes"]) == (len(train_text.encode()), len(val_text.encode()))
    tok = tokenizer_from_meta(meta["tokenizer"])
    assert tok.decode(train.tolist()) == train_text and tok.decode(val.tolist()) == val_text


# --- where the text comes from -------------------------------------------------------------------------------------


def test_a_download_is_saved_as_input_txt_which_the_next_run_uses(tmp_path: Path) -> None:
    text = "To be, or not to be: that is the question.\r\nWhether 'tis nobler — in the mind — to suffer.\n"
    source = write_bytes(tmp_path, "remote.txt", text.encode("utf-8"))
    out = tmp_path / "out"
    for url in (source.as_uri(), BAD_URL):  # the second run cannot download: it reads out/input.txt
        proc = python(CHAR, "--out_dir", out, "--url", url, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert (out / "input.txt").read_bytes() == source.read_bytes()
    meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
    tok = tokenizer_from_meta(meta["tokenizer"])
    # \r\n is kept as is (no newline translation) and non-ASCII characters survive the JSON vocabulary.
    assert tok.decode(load_bin(out / "train.bin").tolist() + load_bin(out / "val.bin").tolist()) == text
    PreparedData(str(out), "remote", block_size=4)  # and its meta.json (sizes, sha256s) describes what it wrote


@pytest.mark.parametrize("script", [CHAR, BPE], ids=["char", "bpe"])
def test_missing_input_and_failed_download_says_how_to_supply_it(script: Path, tmp_path: Path) -> None:
    out = tmp_path / "empty"
    proc = python(script, "--out_dir", out, "--url", BAD_URL, cwd=tmp_path)
    assert_one_line_error(
        proc, 1, "error: ", "no input text", BAD_URL, "--input path/to/tinyshakespeare.txt", "input.txt"
    )
    assert not (out / "train.bin").exists()


LATIN1 = "Ceci est du français, mais en Latin-1.".encode("latin-1")
NOT_UTF8 = ["not UTF-8", "byte 0xe7 at byte offset 16"]


@pytest.mark.parametrize(
    ("script", "name", "data", "fragments"),
    [
        (CHAR, "nope.txt", None, ["cannot read", "nope.txt: No such file or directory"]),
        (CHAR, "empty.txt", b"", ["is empty"]),
        (CHAR, "model.bin", b"PK\x03\x04" + b"plain-looking text" * 10 + b"\x00", ["binary", "byte offset 184"]),
        (CHAR, "latin1.txt", LATIN1, NOT_UTF8),
        (BPE, "latin1.txt", LATIN1, NOT_UTF8),
    ],
    ids=["missing", "empty", "binary", "latin1-char", "latin1-bpe"],
)
def test_an_input_that_is_not_text_is_named_in_one_line(
    script: Path, name: str, data: bytes | None, fragments: list[str], tmp_path: Path
) -> None:
    path = tmp_path / name
    if data is not None:
        path.write_bytes(data)
    proc = python(script, "--input", path, "--out_dir", tmp_path / "out", cwd=tmp_path)
    assert_one_line_error(proc, 1, "error: ", name, *fragments)


def test_an_out_dir_that_cannot_be_created_is_named_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x", encoding="utf-8")
    proc = python(CHAR, "--input", ROOT / "README.md", "--out_dir", tmp_path / "a-file" / "data", cwd=tmp_path)
    assert_one_line_error(proc, 1, "--out_dir", "a-file")


@pytest.mark.parametrize(
    ("script", "text", "fragment"),
    [
        (CHAR, "hello", "5 tokens give 4 train and 1 val"),
        (BPE, "Hello there", "3 tokens give 2 train and 1 val"),
    ],
    ids=["char", "bpe"],
)
def test_text_too_short_for_two_splits(
    script: Path, text: str, fragment: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if script == BPE:
        request.getfixturevalue("gpt2_bpe")  # skips where tiktoken cannot load GPT-2's ranks
    path = write_bytes(tmp_path, "short.txt", text.encode())
    proc = python(script, "--input", path, "--out_dir", tmp_path / "out", cwd=tmp_path)
    assert_one_line_error(proc, 1, "error: ", "short.txt", "too short", fragment, "at least 2", "block_size")


@pytest.mark.slow
def test_char_vocabulary_too_large_for_uint16(tmp_path: Path) -> None:
    # 70,000 distinct code points from U+0001 up, skipping the surrogates (not encodable as UTF-8).
    chars = [chr(i) for i in range(1, 0x12000) if not 0xD800 <= i <= 0xDFFF][:70_000]
    assert len(set(chars)) == 70_000 > UINT16_IDS
    path = write_bytes(tmp_path, "babel.txt", "".join(chars).encode("utf-8"))
    proc = python(CHAR, "--input", path, "--out_dir", tmp_path / "out", cwd=tmp_path)
    assert_one_line_error(proc, 1, "error: ", "babel.txt", "70,000 distinct characters", "65,536", "np.uint16")
    # The same text is fine for BPE, whose ids never depend on the text.
    proc = python(BPE, "--input", path, "--out_dir", tmp_path / "bpe", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_bpe_without_tiktoken_cache_mentions_tiktoken_cache_dir(tmp_path: Path) -> None:
    path = write_bytes(tmp_path, "text.txt", b"Some text that is long enough to split into two parts.\n" * 3)
    # An empty cache, and downloads forced to fail even on a machine with internet access.
    no_cache = str(tmp_path / "no-cache")
    proc = python(
        BPE, "--input", path, "--out_dir", tmp_path / "out", cwd=tmp_path, TIKTOKEN_CACHE_DIR=no_cache, **NO_DOWNLOADS
    )
    assert_one_line_error(proc, 1, "error: ", "r50k_base", "internet", "TIKTOKEN_CACHE_DIR", no_cache)


# --- tokenizers ----------------------------------------------------------------------------------------------------


def test_char_tokenizer_round_trip_and_meta() -> None:
    text = "Hello, World!\nÀ bientôt 🙂\r\n"
    tok = CharTokenizer.from_text(text)
    assert tok.itos == sorted(set(text)) and tok.vocab_size == len(set(text))
    ids = tok.encode(text)
    assert len(ids) == len(text) and tok.decode(ids) == text
    # Through JSON and back, as meta.json and checkpoints store it.
    again = tokenizer_from_meta(json.loads(json.dumps(tok.meta)))
    assert isinstance(again, CharTokenizer) and again.encode(text) == ids
    assert tok.decode(np.array(ids, dtype=np.uint16)) == text  # ids straight from a .bin file


ABC = CharTokenizer.from_text("abc ")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: ABC.encode("abc caé"), r"character 'é' \(U\+00E9\) at position 6 .*training text"),
        (lambda: ABC.decode([0, 4]), "token id 4 at position 1 is outside the vocabulary"),
        (lambda: ABC.decode([-1]), "token id -1"),
        (lambda: tokenizer_from_meta({"kind": "sentencepiece"}), r"entry \{'kind': 'sentencepiece'\} is neither"),
        (lambda: tokenizer_from_meta({"kind": "char"}), r"entry \{'kind': 'char'\} is neither"),
        (lambda: tokenizer_from_meta({"kind": "char", "itos": ["a", "bc"]}), "single character"),
        (lambda: tokenizer_from_meta({"kind": "char", "itos": ["a", "b", "a"]}), "duplicate characters"),
    ],
    ids=[
        "unknown-character",
        "id-past-the-vocabulary",
        "negative-id",
        "unknown-kind",
        "no-itos",
        "itos-not-characters",
        "itos-repeats-a-character",
    ],
)
def test_what_a_tokenizer_cannot_encode_decode_or_load_is_named(call, message) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_tiktoken_tokenizer_round_trip(gpt2_bpe: object) -> None:
    tok = tokenizer_from_meta({"kind": "tiktoken", "encoding": "r50k_base"})
    assert isinstance(tok, TiktokenTokenizer) and tok.vocab_size == 50257 and tok.eot_token == 50256
    text = "Hello world, <|endoftext|> stays text. Ünïcödé 🙂"
    ids = tok.encode(text)
    assert 50256 not in ids and tok.decode(ids) == text
    with pytest.raises(ValueError, match="token id 50257"):
        tok.decode([50257])


def test_batches_are_windows_of_the_file(tiny_data: Path) -> None:
    data = PreparedData(str(tiny_data), "tiny", block_size=16)
    starts = torch.randint(data.num_starts("train"), (3, 4), generator=torch.Generator().manual_seed(0))
    x, y = data.get("train", starts, "cpu")
    ids = load_bin(tiny_data / "train.bin").astype(np.int64)
    assert x.shape == y.shape == (3, 4, 16) and x.dtype == torch.int64
    for (i, j), s in np.ndenumerate(starts.numpy()):
        assert x[i, j].tolist() == ids[s : s + 16].tolist() and y[i, j].tolist() == ids[s + 1 : s + 17].tolist()
    last = data.num_starts("train") - 1  # the last start's target ends at the file's last token: no window is lost
    assert last + 17 == len(ids) and data.get("train", torch.tensor([last]), "cpu")[1][0].tolist() == ids[-16:].tolist()
    data.close()


# --- prepared data checked against its metadata on open ----------------------------------------------------------


def _set_meta(folder: Path, **changes: object) -> None:
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    (folder / "meta.json").write_text(json.dumps({**meta, **changes}), encoding="utf-8")


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda d: _set_meta(d, vocab_size=0), "has vocab_size=0: it must be a positive integer"),
        (lambda d: _set_meta(d, vocab_size=-3), "has vocab_size=-3"),
        (lambda d: _set_meta(d, vocab_size=True), "has vocab_size=True"),
        (lambda d: _set_meta(d, vocab_size="30"), "has vocab_size='30'"),
        (lambda d: _set_meta(d, vocab_size=29), "train.bin holds token id 29, but"),  # the largest id is 29
        (lambda d: _set_meta(d, val_bytes=0), "has val_bytes=0: it must be a positive integer"),
        (lambda d: _set_meta(d, train_tokens="100"), "has train_tokens='100': it must be a positive integer"),
        (lambda d: _set_meta(d, tokenizer={"kind": "char", "itos": ["a", "b"]}), "its tokenizer lists 2 characters"),
        (lambda d: (d / "meta.json").write_bytes(b"\xff{"), "meta.json is unreadable"),
        (lambda d: (d / "meta.json").write_text("[1]", encoding="utf-8"), "meta.json is unreadable"),
        (lambda d: (d / "train.bin").write_bytes((d / "train.bin").read_bytes()[:4000]), "train.bin holds 4,000 bytes"),
        (lambda d: (d / "val.bin").write_bytes((d / "val.bin").read_bytes() + b"\x00"), "val.bin holds 2,961 bytes"),
        (lambda d: _set_meta(d, val_bytes=100), "has val_bytes=100 for val_tokens=1480: each token is at least one"),
        (lambda d: _set_meta(d, train_sha256="abc"), "train.bin is not the file prepared with"),
        (lambda d: make_dataset(d, text="abcdefghij" * 10), "has 10 tokens but block_size is 16"),
    ],
    ids=[
        "vocab-0",
        "vocab-negative",
        "vocab-true",
        "vocab-a-string",
        "vocab-below-an-id",
        "bytes-0",
        "tokens-a-string",
        "itos-shorter",
        "meta-not-utf8",
        "meta-not-an-object",
        "train-truncated",
        "val-odd-bytes",
        "val-bytes-below-tokens",
        "sha256-malformed",
        "shorter-than-a-block",
    ],
)
def test_prepared_data_that_does_not_match_its_metadata_is_refused_on_open(
    tmp_path: Path, damage: object, named: str
) -> None:
    folder = make_dataset(tmp_path / "data")
    damage(folder)
    with pytest.raises(DataError) as e:
        PreparedData(str(folder), "tiny", block_size=16)
    assert named in str(e.value) and "\n" not in str(e.value)


def test_a_file_given_as_data_dir_is_named(tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_text("{}", encoding="utf-8")
    with pytest.raises(DataError, match="meta.json' is a file: give the folder holding train.bin, val.bin"):
        PreparedData(str(tmp_path / "meta.json"), "tiny", block_size=16)


def test_bits_per_byte_counts_the_splits_own_tokens_and_bytes(tmp_path: Path) -> None:
    """A loss of ln 2 nats per token is 1 bit per token: over val's bytes, tokens / bytes bits per byte (a BPE token
    covers several bytes). A dataset written by hand, with no byte counts, has none."""
    folder = make_dataset(tmp_path / "data")
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    del meta["train_bytes"], meta["val_bytes"]
    _set_meta(folder, train_bytes=3 * meta["train_tokens"], val_bytes=4 * meta["val_tokens"])
    assert PreparedData(str(folder), "tiny", block_size=16).bits_per_byte("val", np.log(2)) == pytest.approx(1 / 4)
    (folder / "meta.json").write_text(json.dumps(meta), encoding="utf-8")  # no byte counts
    assert PreparedData(str(folder), "tiny", block_size=16).bits_per_byte("val", 1.0) is None


def test_a_file_cut_short_while_a_run_reads_it_is_named(tmp_path: Path) -> None:
    folder = make_dataset(tmp_path / "data")
    data = PreparedData(str(folder), "tiny", block_size=16)
    (folder / "train.bin").write_bytes((folder / "train.bin").read_bytes()[:100])  # truncated in place
    with pytest.raises(DataError, match="train.bin was cut short while this run read it"):
        data.get("train", torch.tensor([data.num_starts("train") - 1]), "cpu")
    data.close()


@pytest.mark.parametrize("fails_at", ["write", "rename"])
def test_an_interrupted_prepare_leaves_the_old_files_or_a_folder_that_does_not_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails_at: str
) -> None:
    """A full disk while writing the second file keeps the old set whole; a kill between two renames leaves no
    meta.json, which PreparedData refuses. Either way no temporary file stays behind."""
    import data.common as common

    folder = make_dataset(tmp_path / "data")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    new = {"train.bin": b"\x01\x00" * 50, "val.bin": b"\x01\x00" * 50, "meta.json": b"{}"}
    if fails_at == "write":
        real_fdopen, opened = os.fdopen, []

        def fdopen(fd: int, mode: str) -> object:
            opened.append(fd)
            if len(opened) == 2:
                raise OSError(28, "No space left on device")
            return real_fdopen(fd, mode)

        monkeypatch.setattr(common.os, "fdopen", fdopen)
    else:
        real_replace = os.replace

        def replace(src: object, dst: object) -> None:
            if Path(dst).name == "val.bin":
                raise KeyboardInterrupt
            real_replace(src, dst)

        monkeypatch.setattr(common.os, "replace", replace)
    with pytest.raises(Failure if fails_at == "write" else KeyboardInterrupt):
        common.write_atomic(folder, new)
    after = {p.name: p.read_bytes() for p in folder.iterdir()}
    if fails_at == "write":
        assert after == before
    else:
        assert sorted(after) == ["train.bin", "val.bin"] and after["val.bin"] == before["val.bin"]
        with pytest.raises(DataError, match="no meta.json"):
            PreparedData(str(folder), "tiny", block_size=16)


def test_a_device_or_a_pipe_as_the_input_text_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """Reading /dev/zero would fill the memory; reading a named pipe that nobody writes would wait for ever."""
    with pytest.raises(Failure, match="^/dev/zero is not a regular file"):
        read_text_file(Path("/dev/zero"))
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(Failure, match=r"^.*fifo is not a regular file"):
        read_text_file(tmp_path / "fifo")


def test_a_prepare_interrupted_says_so_in_one_line_and_leaves_no_half_written_file(tmp_path: Path, capsys) -> None:
    """Ctrl-C while the text is tokenized (Tiny Shakespeare's BPE takes seconds): exit 130, no traceback."""
    import data.common as common

    (tmp_path / "in.txt").write_text("some text to prepare " * 50, encoding="utf-8")

    def interrupted(text: str) -> object:
        raise KeyboardInterrupt

    argv = ["--input", str(tmp_path / "in.txt"), "--out_dir", str(tmp_path / "out")]
    status = common.run_prepare(argv, description=None, script_file=__file__, make_tokenizer=interrupted)
    assert status == 130 and list((tmp_path / "out").iterdir()) == []
    assert (
        capsys.readouterr().err
        == "\ninterrupted: no half-written file is left in the output folder; run this again to prepare it\n"
    )
