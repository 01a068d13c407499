"""docs/02-triton.md quotes layernorm_triton.py in ```py blocks ("Reading the kernel"): each quote must still be a
run of the file's own consecutive lines, common indentation aside, so the chapter cannot drift from the code."""

from __future__ import annotations

import re
import textwrap

import pytest

from helpers import ROOT

CHAPTER = (ROOT / "docs" / "02-triton.md").read_text(encoding="utf-8")
SOURCE = (ROOT / "layernorm_triton.py").read_text(encoding="utf-8").splitlines()
QUOTE = re.compile(r"```py\n(.*?)```", re.S)
QUOTES = QUOTE.findall(CHAPTER)


def is_quoted_from(quote: str, lines: list[str]) -> bool:
    """Whether the quote's lines are lines[i : i + n] for some i, each side dedented by its common indentation."""
    wanted = textwrap.dedent(quote).splitlines()
    n = len(wanted)
    windows = ("\n".join(lines[i : i + n]) for i in range(len(lines) - n + 1))
    return any(textwrap.dedent(window).splitlines() == wanted for window in windows)


def test_reading_the_kernel_quotes_the_kernel() -> None:
    section = CHAPTER.split("## Reading the kernel\n")[1].split("\n## ")[0]
    # The forward in five pieces, the backward in three, the launch: a changed fence would leave nothing to check.
    assert len(QUOTE.findall(section)) >= 10


@pytest.mark.parametrize("quote", QUOTES, ids=[f"quote-{i}" for i in range(len(QUOTES))])
def test_each_quote_is_the_files_own_lines(quote: str) -> None:
    found = is_quoted_from(quote, SOURCE)
    assert found, f"docs/02-triton.md quotes what layernorm_triton.py does not hold:\n{quote}"
