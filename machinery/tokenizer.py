"""Tokenizers: characters, or GPT-2's byte-level BPE through tiktoken (imported only then), each stored as plain
JSON under the "tokenizer" key of a dataset's meta.json (data/README.md shows both kinds) and of a checkpoint."""

from __future__ import annotations

import codecs
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from machinery.command import first_line

GPT2_ENCODING = "r50k_base"  # GPT-2's BPE: tiktoken's "gpt2" has the same ranks, split pattern and <|endoftext|>
GPT2_BPE = {"kind": "tiktoken", "encoding": GPT2_ENCODING}  # its tokenizer entry, in a checkpoint or meta.json


def _check_ids(ids: Sequence[int], vocab_size: int) -> None:
    for pos, i in enumerate(ids):
        if not 0 <= i < vocab_size:
            raise ValueError(f"token id {i} at position {pos} is outside the vocabulary (0..{vocab_size - 1})")


class CharTokenizer:
    """Character-level tokenizer: token id i stands for the character ``itos[i]``."""

    def __init__(self, itos: Sequence[str]) -> None:
        self.itos = list(itos)
        for i, ch in enumerate(self.itos):
            if not isinstance(ch, str) or len(ch) != 1:
                raise ValueError(f"char vocabulary entry {i} must be a single character, got {ch!r}")
        if len(set(self.itos)) != len(self.itos):  # (a character would encode to another id than it was trained as)
            raise ValueError("char vocabulary has duplicate characters")
        self.stoi = {ch: i for i, ch in enumerate(self.itos)}
        self.vocab_size = len(self.itos)
        self.meta = {"kind": "char", "itos": self.itos}  # its entry in meta.json and in a checkpoint

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """The vocabulary of ``text``: its distinct characters, sorted by code point."""
        return cls(sorted(set(text)))

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[ch] for ch in text]
        except KeyError:
            pos, ch = next((p, c) for p, c in enumerate(text) if c not in self.stoi)
            raise ValueError(
                f"character {ch!r} (U+{ord(ch):04X}) at position {pos} is not in the vocabulary; "
                f"the vocabulary is the {self.vocab_size} characters of the training text"
            ) from None

    def decode(self, ids: Sequence[int]) -> str:
        _check_ids(ids, self.vocab_size)  # a negative id would otherwise index from the end, silently
        return "".join(self.itos[i] for i in ids)

    def decode_stream(self, ids: Iterable[int]) -> Iterator[str]:
        return (self.decode([i]) for i in ids)  # a token is a whole character


class TiktokenTokenizer:
    """Byte-level BPE through tiktoken: GPT-2's (GPT2_ENCODING) unless another encoding is named."""

    def __init__(self, encoding: str = GPT2_ENCODING) -> None:
        try:
            import tiktoken

            self._enc = tiktoken.get_encoding(encoding)
        except ImportError as e:
            raise RuntimeError(f"the BPE tokenizer needs {e.name}: pip install tiktoken") from None
        except ValueError as e:  # an unknown encoding name (tiktoken's message goes on to list its plugins)
            raise ValueError(f"tiktoken encoding {encoding!r}: {first_line(e)}") from None
        except Exception as e:  # the ranks file is not cached and could not be downloaded
            cache = os.environ.get("TIKTOKEN_CACHE_DIR", "unset")
            raise RuntimeError(
                f"tiktoken could not load the BPE ranks of {encoding!r} ({type(e).__name__}): it downloads them the "
                f"first time, which needs internet. On a machine with internet run TIKTOKEN_CACHE_DIR=DIR python -c "
                f"\"import tiktoken; tiktoken.get_encoding('{encoding}')\", copy DIR here and set TIKTOKEN_CACHE_DIR "
                f"to it (now: {cache})"
            ) from None
        self.meta = {"kind": "tiktoken", "encoding": encoding}  # its entry in meta.json and in a checkpoint
        self.vocab_size = self._enc.n_vocab
        self.eot_token = self._enc.eot_token

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)  # a literal "<|endoftext|>" in the text is text, not the special token

    def decode(self, ids: Sequence[int]) -> str:
        _check_ids(ids, self.vocab_size)
        return self._enc.decode([int(i) for i in ids])

    def decode_stream(self, ids: Iterable[int]) -> Iterator[str]:
        """The text as the ids arrive. A token may end inside a UTF-8 character (an emoji is often two tokens):
        its bytes wait until the character is whole, so the pieces join to exactly ``decode(ids)``."""
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # decode's errors="replace", byte by byte
        for i in ids:
            _check_ids([i], self.vocab_size)
            yield utf8.decode(self._enc.decode_single_token_bytes(int(i)))
        yield utf8.decode(b"", final=True)  # bytes that never became a character: U+FFFD, as decode gives


def tokenizer_from_meta(tok: dict[str, Any]) -> CharTokenizer | TiktokenTokenizer:
    """Rebuild the tokenizer that meta.json's (or a checkpoint's) ``"tokenizer"`` entry describes; an entry of
    neither kind is a ValueError naming it."""
    kind = tok.get("kind") if isinstance(tok, dict) else None
    if kind == "char" and isinstance(tok.get("itos"), list):  # (a dict's keys would pass for its characters)
        return CharTokenizer(tok["itos"])
    if kind == "tiktoken":
        return TiktokenTokenizer(tok.get("encoding", GPT2_ENCODING))  # (tiktoken refuses a name that is not a str)
    raise ValueError(
        f"the tokenizer entry {tok!r:.80} is neither {{'kind': 'char', 'itos': [its characters]}} nor "
        f"{{'kind': 'tiktoken', 'encoding': a tiktoken encoding}}"
    )
