"""The chapters' figures against the files they cite, and each chapter's sources.

docs/05's table of runs names, for every val loss the chapters quote, the file it comes from: each figure is read
back from that file. Chapters 01 and 03 to 06 end with a "Sources" list whose links are well formed.
"""

from __future__ import annotations

import re

import pytest

from helpers import ROOT

RESULTS = ROOT / "docs" / "05-results.md"
# docs/02 has a test of its own, for its quoted kernel
CHAPTERS_WITH_SOURCES = [
    "01-layernorm.md",
    "03-batch-independence.md",
    "04-why-layernorm.md",
    "05-results.md",
    "06-running.md",
]
NUMBER = re.compile(r"-?\d+\.\d+(?:[eE][-+]?\d+)?")
LINK = re.compile(r"\]\(([^)\s]+)\)")  # every Markdown link target
# an arXiv abstract page, a GitHub repository or a path in one, or a page of a named site
WELL_FORMED = re.compile(
    r"https://(arxiv\.org/abs/\d{4}\.\d{4,5}|github\.com/[\w.-]+/[\w.-]+(/[\w./-]+)?|[\w.-]+\.\w+/[\w/.-]*)"
)


def markdown_table_after(text: str, first_header: str) -> list[dict[str, str]]:
    """The rows of the first Markdown table whose header row starts with `| first_header |`, as dicts."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    header = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True)))
    return rows


RUNS = markdown_table_after(RESULTS.read_text(encoding="utf-8"), "run")  # docs/05's table of runs


def test_the_runs_table_lists_every_quoted_val_loss() -> None:
    figures = {row["val loss"] for row in RUNS}
    assert {"1.8667", "1.8894", "1.8979", "1.9018", "1.9047", "2.1528", "2.1618", "2.1662"} <= figures


@pytest.mark.parametrize("row", RUNS, ids=lambda row: f"{row['run']}-{row['norm']}-{row['val loss']}")
def test_each_val_loss_is_in_the_file_it_cites(row: dict[str, str]) -> None:
    (cited,) = re.findall(r"`([^`]+)`", row["file"])
    text = (ROOT / cited).read_text(encoding="utf-8")
    figure = row["val loss"]
    decimals = len(figure.split(".")[1])
    found = {f"{float(n):.{decimals}f}" for n in NUMBER.findall(text)}
    assert figure in found, f"{cited} holds no number that rounds to {figure}"


@pytest.mark.parametrize("chapter", CHAPTERS_WITH_SOURCES)
def test_each_chapter_ends_with_its_sources(chapter: str) -> None:
    text = (ROOT / "docs" / chapter).read_text(encoding="utf-8")
    headings = re.findall(r"^## (.*)$", text, re.M)
    assert headings[-1] == "Sources", f"{chapter} ends with '{headings[-1]}', not 'Sources'"
    if "Exercises" in headings:
        assert headings[-2] == "Exercises"
    links = LINK.findall(text.split("\n## Sources\n")[1])
    assert links, f"{chapter}'s Sources list has no link"
    assert all(WELL_FORMED.fullmatch(link) for link in links), links


def test_the_readme_links_the_layernorm_paper_and_its_sample_comes_from_the_file_it_cites() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "(https://arxiv.org/abs/1607.06450)" in readme
    (sample,) = re.findall(r"\(`bench/results/quickstart_cpu.log`\):\n\n```\n(.*?)```", readme, re.S)
    assert sample.strip() and sample in (ROOT / "bench/results/quickstart_cpu.log").read_text(encoding="utf-8")


def test_the_one_pass_variance_demo_shows_the_cancellation(capsys: pytest.CaptureFixture[str]) -> None:
    text = (ROOT / "docs" / "01-layernorm.md").read_text(encoding="utf-8")
    (demo,) = [block for block in re.findall(r"```python\n(.*?)```", text, re.S) if "one_pass" in block]
    exec(compile(demo, "docs/01-layernorm.md, the variance demo", "exec"), {"__name__": "demo"})
    errors = [[float(n) for n in NUMBER.findall(line)[-2:]] for line in capsys.readouterr().out.splitlines()]
    assert len(errors) == 3
    assert errors[0][0] < 1e-5 and errors[2][0] > 1.0  # one-pass: fine at offset 0, useless at 1e4
    assert all(two_pass < 1e-5 for _, two_pass in errors)
