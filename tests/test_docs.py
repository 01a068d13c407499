"""The chapters' figures against the files they cite, what their code prints, and each chapter's sources.

docs/05's table of runs names, for every val loss the chapters quote, the file it comes from: each figure is read
back from that file; so are chapter 1's residual stream and chapter 3's BatchNorm failures. Every ```python block
of the README and docs/ runs; one followed by a ```text block shows what it prints, and its output is compared.
Chapters 01 and 03 to 06 end with a "Sources" list whose links are well formed.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest
import torch

from helpers import DOCS, ROOT, TINY, skip_an_interpreter_block, tiny_model

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


@pytest.mark.parametrize("row", RUNS, ids=lambda row: f"{row['run']}-{row['norm']}-{row['val loss']}")
def test_each_val_loss_is_in_the_file_it_cites(row: dict[str, str]) -> None:
    (cited,) = re.findall(r"`([^`]+)`", row["file"])
    text = (ROOT / cited).read_text(encoding="utf-8")
    figure = row["val loss"]
    decimals = len(figure.split(".")[1])
    found = {f"{float(n):.{decimals}f}" for n in NUMBER.findall(text)}
    assert figure in found, f"{cited} holds no number that rounds to {figure}"


def test_the_runs_bits_per_byte_are_their_val_losses_over_ln_2(shakespeare_path: Path) -> None:
    """As the table says: one byte a character in Tiny Shakespeare, so bits per byte = nats per token / ln 2."""
    assert shakespeare_path.read_bytes().isascii()
    assert [row["bits/byte"] for row in RUNS] == [f"{float(row['val loss']) / math.log(2):.4f}" for row in RUNS]


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


def test_the_readmes_sample_comes_from_the_file_it_cites() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (sample,) = re.findall(r"\(`bench/results/quickstart_cpu.log`\):\n\n```\n(.*?)```", readme, re.S)
    assert sample.strip() and sample in (ROOT / "bench/results/quickstart_cpu.log").read_text(encoding="utf-8")


FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)
ROUNDING = 1e-9  # printed numbers below this are rounding, equal to any other such number
PRINTED_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")  # 4e-16 too


def python_blocks(text: str) -> list[tuple[str, str | None]]:
    """(code, output) for every ```python block: its output is the ```text block directly after it, or None."""
    blocks = list(FENCE.finditer(text))
    return [
        (a[2], b[2] if b is not None and b[1] == "text" and not text[a.end() : b.start()].strip() else None)
        for a, b in zip(blocks, [*blocks[1:], None], strict=False)
        if a[1] == "python"
    ]


BLOCKS = [(doc, i, *pair) for doc in DOCS for i, pair in enumerate(python_blocks(doc.read_text(encoding="utf-8")))]


def same_output(shown: str, printed: str) -> bool:
    """The same words, and each number within 15% (a printed float error moves a little with the CPU's summation
    order), or both below ROUNDING."""
    if PRINTED_NUMBER.sub("#", shown) != PRINTED_NUMBER.sub("#", printed):
        return False
    pairs = zip(PRINTED_NUMBER.findall(shown), PRINTED_NUMBER.findall(printed), strict=True)
    return all(
        abs(a - b) <= 0.15 * max(abs(a), abs(b)) or max(abs(a), abs(b)) < ROUNDING
        for a, b in ((float(x), float(y)) for x, y in pairs)
    )


def test_the_chapters_show_what_their_code_prints() -> None:
    chapters = [doc.name for doc, _, _, shown in BLOCKS if shown is not None]
    assert {"01-layernorm.md", "02-triton.md"} <= set(chapters) and chapters.count("01-layernorm.md") >= 7


@pytest.mark.parametrize(("doc", "i", "code", "shown"), BLOCKS, ids=[f"{d.name}-{i}" for d, i, *_ in BLOCKS])
def test_each_python_block_runs_and_prints_what_its_text_block_shows(doc, i, code, shown, capsys):
    skip_an_interpreter_block(code)
    exec(compile(code, f"{doc.name}, python block {i}", "exec"), {"__name__": f"block_{i}"})
    printed = capsys.readouterr().out
    assert shown is None or same_output(shown, printed), f"{doc.name} shows:\n{shown}\nits block prints:\n{printed}"


def figures_in(text: str) -> set[str]:
    return set(NUMBER.findall(text))


def rounded(value: float, decimals: int) -> str:
    return f"{value:.{decimals}f}"


def test_chapter_1s_residual_stream_comes_from_inside_norms_json() -> None:
    result = json.loads((ROOT / "experiments/results/inside_norms/inside_norms.json").read_text(encoding="utf-8"))
    rms = result["token_rms"]
    section = (ROOT / "docs/01-layernorm.md").read_text(encoding="utf-8").split("## Why normalise\n")[1]
    section = section.split("\n## ")[0]
    norm_medians = [row["p50"] for key in ("ln_1_out", "ln_2_out") for row in rms[key]]
    quoted = {
        rounded(rms["resid_in"][0]["p50"], 2),  # the embeddings
        rounded(rms["final_resid"]["p50"], 2),  # entering ln_f
        rounded(rms["final_resid"]["min"], 2),
        rounded(rms["final_resid"]["max"], 2),
        rounded(rms["final_resid"]["p10"], 2),  # the plot's bars
        rounded(rms["final_resid"]["p90"], 2),
        rounded(min(norm_medians), 2),
        rounded(max(norm_medians), 2),
    }
    assert quoted <= figures_in(section), quoted - figures_in(section)
    assert f"{round(result['run_time_s'])} s" in section  # the experiment's run time


def test_batchnorms_three_failures_come_from_their_file() -> None:
    path = ROOT / "experiments/results/batchnorm_failures/batchnorm_failures.json"
    result = json.loads(path.read_text(encoding="utf-8"))
    text = (ROOT / "docs/03-batch-independence.md").read_text(encoding="utf-8")
    section = text.split("## BatchNorm's three failures\n")[1].split("\n## ")[0]
    spread, leak, loss = result["one_token_spread"], result["causal_leak"], result["val_loss"]
    assert spread["batchnorm"] == 0.0 and leak["builtin"] == 0.0 and leak["batchnorm, running averages"] == 0.0
    quoted = {rounded(spread["builtin"], 2), rounded(leak["batchnorm"], 3), *(rounded(v, 3) for v in loss.values())}
    assert quoted <= figures_in(section), quoted - figures_in(section)
    assert f"for {result['iters']} iterations" in section and f"same {result['val_windows']} val" in section
    assert f"{result['model_args']['block_size']}-token window" in section
    assert f"{round(result['run_time_s'])} s" in section  # the experiment's run time, stated with its figures


def test_batchnorm_failures_measures_batch_statistics_and_leaves_the_model_alone(monkeypatch) -> None:
    """The measurements behind docs/03's three failures, on fresh tiny models: a measurement in eval mode, or one
    that let BatchNorm's running averages move, would break it."""
    monkeypatch.syspath_prepend(ROOT / "experiments")  # as when it runs: its folder on the path (common.py)
    failures = importlib.import_module("batchnorm_failures")
    batchnorm, layernorm = tiny_model("batchnorm"), tiny_model("builtin")
    before = {k: v.clone() for k, v in batchnorm.state_dict().items()}
    window = torch.arange(TINY.block_size) % TINY.vocab_size
    assert failures.one_token_spread(batchnorm) == 0.0 and failures.one_token_spread(layernorm) > 0.1
    assert failures.causal_leak(batchnorm, window) > 0
    assert failures.causal_leak(batchnorm, window, training=False) == 0.0
    assert failures.causal_leak(layernorm, window) == 0.0
    x = torch.stack([window, window.flip(0)])
    batches = [(x, x.roll(1, dims=1))]
    one_each = failures.val_loss(batchnorm, batches, training=True, rows=1)
    assert one_each != failures.val_loss(batchnorm, batches, training=True)
    assert all(torch.equal(v, batchnorm.state_dict()[k]) for k, v in before.items())
    assert not batchnorm.training


def test_removing_layernorm_comes_from_remove_layernorm_json() -> None:
    """docs/04's section on removing LayerNorm: every measured figure is read back from the results it cites."""
    folder = ROOT / "experiments/results/remove_layernorm"
    result = json.loads((folder / "remove_layernorm.json").read_text(encoding="utf-8"))
    text = (ROOT / "docs/04-why-layernorm.md").read_text(encoding="utf-8")
    section = text.split("## Removing LayerNorm from a trained model\n")[1].split("\n## ")[0]
    s, before, after = result["summary"], result["scales_before"], result["scales_after"]
    spread = lambda stats: stats["p95_ratio"] / stats["p5_ratio"]
    blocks = [f"h.{i}.{n}" for i in range(3) for n in ("ln_1", "ln_2")]
    quoted = {
        rounded(result["original"]["val_loss"], 4),
        *(rounded(s[arm][k], 4) for arm in ("control", "ln_free", "gap") for k in ("mean", "std")),
        rounded(result["original"]["val_loss"] - s["ln_free"]["mean"], 4),
        *(rounded(r["after"]["mean"] - r["before"]["mean"], 4) for r in s["removals"].values()),
        *(rounded(before[n][k], 2) for n in ("ln_f", "h.3.ln_2", "h.0.ln_1") for k in ("p5_ratio", "p95_ratio")),
        *(rounded(after[n][k], 2) for n in ("ln_f", "h.3.ln_2") for k in ("p5_ratio", "p95_ratio")),
        rounded(spread(after["h.3.ln_2"]), 1),
        rounded(spread(before["h.3.ln_2"]), 1),
        rounded(min(after[n]["p50_ratio"] for n in blocks), 2),
        rounded(max(after[n]["p50_ratio"] for n in blocks), 2),
        *(rounded(f([spread(stats[n]) for n in blocks]), 2) for stats in (before, after) for f in (min, max)),
        rounded(before["h.0.ln_1"]["constant"], 3),
        rounded(before["ln_f"]["constant"], 3),
        *(rounded(min(r["control"]["evals"][1][1] for r in result["runs"]), 2),),
        *(rounded(max(r["control"]["evals"][1][1] for r in result["runs"]), 2),),
    }
    assert quoted <= figures_in(section), quoted - figures_in(section)
    assert result["runs"][0]["control"]["evals"][1][0] == 40 and [r["seed"] for r in result["runs"]] == [1337, 1, 2]
    fold = result["fold"]
    assert f"{fold['float32']['relative']:.1e}" in section and f"{fold['float64']['relative']:.1e}" in section
    settings = result["settings"]
    tokens = settings["measure_batches"] * settings["batch_size"] * settings["block_size"]
    share = f"{100 * result['fine_tuning_tokens'] / result['trained_tokens']:.0f}%"
    for fact in (f"{tokens:,} tokens", f"{result['fine_tuning_tokens']:,} tokens", f"{result['trained_tokens']:,}"):
        assert fact in section, fact
    assert f"{share} of the" in section and f"({result['run_time_s'] / 60:.0f} minutes" in section
    centre = json.loads((ROOT / "experiments/results/centre_and_rescale/centre_and_rescale.json").read_text())
    assert rounded(centre["table"]["centre"]["mean"], 4) in figures_in(section)
    blocks = {b[2].split()[1]: b[2].splitlines()[1:] for b in FENCE.finditer(section) if b[2].startswith("python ")}
    for command, name in (("sample.py", "sample.txt"), ("batch_independence.py", "batch_independence.txt")):
        printed = (folder / name).read_text(encoding="utf-8").splitlines()  # what the command printed, whole
        assert blocks[command] and all(line in printed for line in blocks[command]), name


def test_removing_layernorms_budgets_come_from_their_files() -> None:
    """docs/04's table of fine-tuning budgets: each row's tokens and gap from its run's JSON."""
    folder = ROOT / "experiments/results/remove_layernorm"
    section = (ROOT / "docs/04-why-layernorm.md").read_text(encoding="utf-8").split("**How much fine-tuning")[1]
    rows = markdown_table_after(section, "fine-tuning")
    for row, sub in zip(rows, ("iters120", "iters240", ""), strict=True):
        result = json.loads((folder / sub / "remove_layernorm.json").read_text(encoding="utf-8"))
        gap, settings = result["summary"]["gap"], result["settings"]
        assert row["fine-tuning"].startswith(f"{settings['iters']} iterations")
        assert row["tokens"] == f"{result['fine_tuning_tokens']:,}" and len(result["runs"]) == 3
        trained = result["trained_tokens"]
        assert row[f"of the Quickstart's {trained:,}"] == f"{100 * result['fine_tuning_tokens'] / trained:.0f}%"
        assert row["LN-free minus control (mean, 3 seeds)"] == f"{gap['mean']:+.4f}"
        assert row["std"] == f"{gap['std']:.4f}"
        if sub:  # its command and run time
            command = f"--iters {settings['iters']} --remove_at {' '.join(map(str, settings['remove_at']))}"
            assert re.search(rf"`{command}[^`]*`: {result['run_time_s'] / 60:.0f} minutes", section), command
    short = json.loads((folder / "iters120" / "remove_layernorm.json").read_text(encoding="utf-8"))
    quoted = {rounded(short["summary"][arm]["mean"], 4) for arm in ("control", "ln_free")}
    assert quoted | {rounded(short["original"]["val_loss"], 4)} <= figures_in(section)
