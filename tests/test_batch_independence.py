"""batch_independence.py: the LayerNorms and RMSNorm pass, BatchNorm with batch statistics fails, and the exit status
says so, with PyTorch's kernels and in the batch-invariant mode (bit-exact there); from a random model and from a
checkpoint. In this process (main() is what the script exits with), on the CPU (--device cpu), at a few tokens;
tests/test_readme_commands.py runs the script as a process, as the README prints it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import batch_independence
from helpers import ROOT, TRITON_SKIP, assert_one_line_error, command, save_model, tiny_model
from machinery.command import Failure
from model import GPT

SMALL = ["--device", "cpu", "--prompt_len", "6", "--new_tokens", "6"]  # on the CPU; a few steps are enough
TRITON_ON_CPU = TRITON_SKIP is None and os.environ.get("TRITON_INTERPRET") == "1"  # the kernels take CPU tensors


MODE_TITLE = "In the batch-invariant mode, batch_invariant/ (tolerance 0):"


def row_lines(stdout: str, mode: bool = False) -> dict[str, str]:
    """Rows by name of the stock table (or of the batch-invariant one): the lines that end in PASS or FAIL."""
    stock, _, invariant = stdout.partition(MODE_TITLE)
    return {
        line.split()[0]: line
        for line in (invariant if mode else stock).splitlines()
        if " PASS" in line or " FAIL" in line.split("(")[0]
    }


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    status = batch_independence.main(["--json", *args])
    return status, json.loads(capsys.readouterr().out)


def test_out_holds_the_rows_so_far_when_a_run_is_cut_and_the_whole_result_at_the_end(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--out is rewritten after every row: cut during the third (Ctrl-C, or bench/gpu.sh's time limit), it holds the
    first two, with no verdict yet; a whole run leaves the JSON that --json prints."""
    out = tmp_path / "demo.json"
    done = []

    def cut_at_the_third(*args, real=batch_independence.run_row):
        if len(done) == 2:
            raise KeyboardInterrupt
        done.append(real(*args))
        return done[-1]

    with monkeypatch.context() as m:
        m.setattr(batch_independence, "run_row", cut_at_the_third)
        with pytest.raises(KeyboardInterrupt):
            batch_independence.main(["--norms", "custom", "builtin", "--out", str(out), *SMALL])
    saved = json.loads(out.read_text())
    assert saved["rows"] == done[:1] and saved["batch_invariant_rows"] == done[1:] and "ok" not in saved
    _, printed = run_json(capsys, "--norms", "custom", "--out", str(out), *SMALL)
    assert json.loads(out.read_text()) == printed and printed["ok"]


@pytest.mark.slow
def test_default_run_decodes_every_norm_in_both_tables(capsys: pytest.CaptureFixture[str]) -> None:
    """The default rows, each in both tables (triton where it can run), and exit 0: every required row (all but
    batchnorm) passes, in the mode bit-exact. What the rows and the report say: the test below."""
    proc = command(capsys, batch_independence.main, SMALL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = ["custom", "builtin", "rmsnorm", "batchnorm", "dyt", "batchnorm-eval"]
    if TRITON_ON_CPU:
        expected.append("triton")
    else:
        assert "skipped triton" in proc.stdout
    assert sorted(row_lines(proc.stdout)) == sorted(expected), proc.stdout
    assert sorted(row_lines(proc.stdout, mode=True)) == sorted(expected), proc.stdout


def test_a_required_batchnorm_fails_the_run_and_the_report_reads_the_json(capsys: pytest.CaptureFixture[str]) -> None:
    """One run, batchnorm required: its JSON, then the text report main prints without --json, made from it."""
    status, result = run_json(capsys, "--norms", "custom", "batchnorm", "--require", "batchnorm", *SMALL)
    assert status == 1 and result["ok"] is False
    assert result["failed"] == ["batchnorm", "batchnorm (batch-invariant)"]
    assert result["tolerance"] == batch_independence.TOLERANCE["float32"] and result["dtype"] == "float32"
    assert result["new_tokens"] == 6
    rows = {r["name"]: r for r in result["rows"]}
    assert list(rows) == ["custom", "batchnorm", "batchnorm-eval"]

    custom = rows["custom"]  # within --tol: test_the_verdict_is_the_tolerance_and_the_tokens
    assert not custom["required"] and custom["passed"] and custom["statistics"] == "per token"

    bn = rows["batchnorm"]  # each check sees BatchNorm's batch statistics
    assert bn["required"] and not bn["passed"] and bn["statistics"] == "batch statistics"
    ab = bn["alone_vs_batch"]
    assert (
        ab["max_abs_diff"] > 1e-3 and len(ab["per_step_max_abs_diff"]) == 6 and ab["first_divergent_step"] is not None
    )
    assert bn["cached_vs_full"]["max_abs_diff"] > 1e-3
    assert bn["norm_alone"]["max_abs_diff"] > 1e-3 and not bn["norm_alone"]["bit_exact"]
    assert rows["batchnorm-eval"]["passed"] and rows["batchnorm-eval"]["statistics"] == "running averages"
    # (4) prompts of 6, 4, 3 and 1 tokens left padded: each row as alone, but with batch statistics
    ragged = custom["ragged_vs_alone"]
    assert ragged["lengths"] == [6, 4, 3, 1] and ragged["tokens_agree"] and ragged["max_abs_diff"] <= 1e-5
    assert bn["ragged_vs_alone"]["max_abs_diff"] > 1e-3 and bn["ragged_vs_alone"]["tokens_agree"] is False

    # the same rows in the batch-invariant mode (bit-exact there: test_bfloat16_autocast), BatchNorm as far off
    mode = {r["name"]: r for r in result["batch_invariant_rows"]}
    assert list(mode) == list(rows) and mode["custom"]["ragged_vs_alone"]["max_abs_diff"] == 0.0
    assert mode["batchnorm-eval"]["passed"] and not mode["batchnorm"]["passed"]

    text = batch_independence.report(result)
    stock_lines, mode_lines = row_lines(text), row_lines(text, mode=True)
    assert "6/6 agree" in stock_lines["custom"] and stock_lines["custom"].endswith("PASS  (not required)"), text
    assert mode_lines["custom"].count("bit-exact") == 3, mode_lines["custom"]
    assert "differ from step" in stock_lines["batchnorm"] and stock_lines["batchnorm"].endswith("FAIL"), text
    ragged_lines = text.partition("(4) ragged: prompts of 6, 4, 3, 1 tokens left padded")[2].splitlines()
    assert ragged_lines[2].split() == [
        "custom",
        *(f"{ragged['max_abs_diff']:.1e},", "tokens", "agree"),
        "bit-exact,",
        "tokens",
        "agree",
    ]
    tolerance = f"tolerance {batch_independence.TOLERANCE['float32']:g} x max |value|"
    for fragment in (*batch_independence.LEGEND, tolerance, "float32, TF32 off", "no variance", "decodes blind"):
        assert fragment in text, fragment
    assert text.endswith("\nFAIL: required rows that failed: batchnorm, batchnorm (batch-invariant)"), text


def test_the_verdict_is_the_tolerance_and_the_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    """A row passes when every check is within --tol of its scale and the tokens agree: the custom row fails with
    --tol at half its largest relative difference; batchnorm, whose tokens differ, fails however loose --tol is."""
    _, result = run_json(capsys, "--norms", "custom", *SMALL)
    worst = max(
        c["max_abs_diff"] / c["scale"] for c in (result["rows"][0][check] for check in batch_independence.CHECKS)
    )
    assert worst > 0  # PyTorch's kernels round a batch of one and of four differently
    status, result = run_json(capsys, "--norms", "custom", "--tol", str(worst / 2), *SMALL)
    assert status == 1 and result["failed"] == ["custom"]
    status, result = run_json(capsys, "--norms", "batchnorm", "--require", "batchnorm", "--tol", "1e30", *SMALL)
    assert status == 1 and result["failed"][0] == "batchnorm"


def test_from_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every row gets the checkpoint's weights; a BatchNorm checkpoint's running buffers are left over elsewhere.
    Read from --out_dir or --ckpt (which file each names: resolve_weights, in test_sample.py and test_nanogpt.py)."""
    for trained_with, flag in (("builtin", "--out_dir"), ("batchnorm", "--ckpt")):
        model = tiny_model(trained_with, vocab_size=20)
        save_model(tmp_path / trained_with / "ckpt.pt", model, {"kind": "char", "itos": list("abc")})
        norms = ("--norms", "custom", "rmsnorm", "batchnorm")
        status, result = run_json(capsys, flag, str(tmp_path / trained_with / "ckpt.pt"), "--device", "cpu", *norms)
        assert status == 0, result
        assert f"trained with norm={trained_with}" in result["source"] and "strict=False" in result["source"]
        assert result["model"] == {k: getattr(model.config, k) for k in result["model"]} and len(result["model"]) == 5
        assert result["prompt_len"] + result["new_tokens"] <= 16 and result["notes"]  # cut to fit the block
        rows = {r["name"]: r for r in result["rows"]}
        assert rows["custom"]["passed"] and rows["rmsnorm"]["passed"] and not rows["batchnorm"]["passed"]


@pytest.mark.slow  # a model of configs/shakespeare_char.json's size (6 x 384), decoded
def test_a_random_model_of_a_config_s_size(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config_file = ROOT / "configs" / "shakespeare_char.json"
    small = ["--device", "cpu", "--norms", "builtin", "--new_tokens", "4", "--prompt_len", "4"]
    status, result = run_json(capsys, "--config", str(config_file), *small)
    written = json.loads(config_file.read_text(encoding="utf-8"))
    assert status == 0 and result["model"]["n_layer"] == written["n_layer"]
    assert result["model"]["n_embd"] == written["n_embd"]
    assert result["batch_invariant_rows"][0]["alone_vs_batch"]["max_abs_diff"] == 0.0
    (tmp_path / "bad.json").write_text("[1]")
    with pytest.raises(Failure, match="^config file .*bad.json must hold a JSON object"):
        batch_independence.main(["--config", str(tmp_path / "bad.json")])
    (tmp_path / "odd.json").write_text('{"n_head": 5}')
    with pytest.raises(Failure, match=r"--config: n_embd \(64\) must be divisible by n_head \(5\)"):
        batch_independence.main(["--config", str(tmp_path / "odd.json")])


def test_bad_arguments_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_line_error(command(capsys, batch_independence.main, ["--out_dir", str(tmp_path)]), 1, "no checkpoint")
    for args, fragment in (
        (["--norms", "groupnorm"], "'groupnorm'"),
        (["--norms", "custom", "--require", "builtin"], "'builtin' not among the rows run"),
        (["--new_tokens", "0"], "--new_tokens"),
        (["--device", "nonsense"], "device='nonsense' is not a device here; choose auto, cpu, cuda, cuda:N or mps"),
        (["--out", str(tmp_path)], "--out " + str(tmp_path) + ": a folder; give the path of a file"),
    ):
        proc = command(capsys, batch_independence.main, args)
        assert_one_line_error(proc, 2, fragment)
        assert proc.stdout == ""


def test_an_error_inside_a_check_is_its_row_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """The one error path: a RuntimeError while decoding alone (inside GPT.generate) stops that decoding, the other
    checks still run, the row fails with the error's first line, and the run exits 1."""
    hidden_states = GPT.hidden_states

    def fails_alone_at_step_2(self, idx, kv_cache=None, pad=None):
        if kv_cache is not None and idx.size(0) == 1 and kv_cache.length > 6:  # prompt 6, then step 1 fed 1 token
            raise RuntimeError("boom\nsecond line")
        return hidden_states(self, idx, kv_cache, pad)

    monkeypatch.setattr(GPT, "hidden_states", fails_alone_at_step_2)
    status, result = run_json(capsys, "--norms", "custom", *SMALL)
    assert status == 1 and result["ok"] is False and result["failed"] == ["custom", "custom (batch-invariant)"]
    (row,) = result["rows"]
    ab = row["alone_vs_batch"]
    assert ab["error"] == "alone, RuntimeError: boom"
    assert ab["per_step_max_abs_diff"] == [] and ab["max_abs_diff"] is None and ab["tokens_agree"] is None
    assert row["cached_vs_full"]["max_abs_diff"] <= 1e-5 and row["norm_alone"]["bit_exact"] and not row["passed"]

    out = batch_independence.report(result)  # what main prints without --json
    assert "alone fails" in row_lines(out)["custom"] and " FAIL" in row_lines(out)["custom"]
    assert "  custom: alone, RuntimeError: boom\n" in out and "FAIL: required rows that failed: custom" in out
    assert "  custom (batch-invariant): alone, RuntimeError: boom\n" in out


def test_bfloat16_autocast(capsys: pytest.CaptureFixture[str]) -> None:
    """--dtype=bfloat16: the logits are bfloat16's, compared within its tolerance; the mode is still bit-exact."""
    status, result = run_json(capsys, "--dtype", "bfloat16", "--norms", "builtin", "batchnorm", *SMALL)
    assert status == 0 and result["dtype"] == "bfloat16 autocast"
    assert result["tolerance"] == batch_independence.TOLERANCE["bfloat16"]
    stock, mode = ({r["name"]: r for r in result[w]} for w in ("rows", "batch_invariant_rows"))
    assert stock["builtin"]["passed"] and not stock["batchnorm"]["passed"]  # passed: within that tolerance
    assert mode["builtin"]["passed"] and mode["builtin"]["alone_vs_batch"]["max_abs_diff"] == 0.0


def test_triton_is_skipped_with_a_reason_when_it_cannot_run(
    capsys: pytest.CaptureFixture[str], triton_compiled_for_a_gpu: None
) -> None:
    """On the CPU without Triton's interpreter (kernels defined for a GPU), or without triton at all: the
    TritonUnavailableError raised while decoding is no measurement, so the row is skipped with its reason, not
    reported as an error; a required row that was skipped fails the run."""
    proc = command(capsys, batch_independence.main, ["--norms", "triton", "custom", "--require", "triton", *SMALL])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "skipped triton" in proc.stdout and "triton is required but was skipped: counted as a failure" in proc.stdout
    assert ("TRITON_INTERPRET" in proc.stdout) == (TRITON_SKIP is None)  # with triton, the interpreter is the fix
    assert sorted(row_lines(proc.stdout)) == ["custom"]
