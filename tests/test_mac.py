"""What a Mac sees, on a machine without one: no triton package, an MPS device, python.org's Python without its
certificates. Only the device queries are simulated (torch.backends.mps.is_available, the MPS generator's lookup,
torch.mps.synchronize, torch.mps.driver_allocated_memory); everything behind them is the project's real code, and
the MPS generator's state really goes through a checkpoint file. Exact resume on a real Apple GPU is untested here.
The Triton norm's refusal is tested here for every command that builds a model, where triton is missing and where
its kernels were defined for a GPU that is not here.
"""

from __future__ import annotations

import http.client
import ssl
import sys
from pathlib import Path

import pytest
import torch

import sample
import train
from bench import common, decoding
from data.common import run_prepare
from helpers import ROOT, assert_one_line_error, command, tiny_args
from machinery.checkpoint import load_checkpoint
from machinery.device import peak_memory
from machinery.tokenizer import CharTokenizer

CERT_ERROR = "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer certificate"


@pytest.fixture
def mps_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch says an Apple GPU is here (the query alone: no MPS kernel can run on this machine)."""
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)


# ---- --norm=triton where it cannot run, in every command that builds a model ----


@pytest.mark.parametrize("cause", ["no-triton-package", "kernels-compiled-for-a-gpu"])
@pytest.mark.parametrize("main", ["train", "sample", "bench.decoding"])
def test_norm_triton_where_it_cannot_run_is_one_line_naming_the_cause_before_anything_is_read(
    main: str,
    cause: str,
    mps_here: None,
    triton_compiled_for_a_gpu: None,
    trained: tuple[Path, dict],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """Without the triton package (a Mac, Windows: the cause on every device, the Apple GPU's too), or with its
    kernels defined for a GPU and no GPU here (a Python started without TRITON_INTERPRET): exit status 2, one line,
    nothing printed or written."""
    if cause == "no-triton-package":
        monkeypatch.setitem(sys.modules, "triton", None)  # what `import triton` does where it is not installed
    commands = {
        "train": (train.cli, [f"--out_dir={tmp_path / 'out'}", "--device=mps", "--norm=triton"]),
        "sample": (sample.main, ["--out_dir", str(trained[0]), "--norm", "triton", "--device", "cpu"]),
        "bench.decoding": (decoding.main, ["--out_dir", str(trained[0]), "--norms", "triton", "--device", "cpu"]),
    }
    proc = command(capsys, *commands[main])
    err = assert_one_line_error(proc, 2)
    assert err.startswith("error: norm 'triton' ") and proc.stdout == "" and not (tmp_path / "out").exists(), err
    if cause == "no-triton-package":  # the interpreter needs triton too: no circle
        assert "Linux only" in err and "'custom' or 'builtin'" in err and "TRITON_INTERPRET" not in err, err


# ---- the MPS generator in the checkpoint ----


def test_the_checkpoint_keeps_the_mps_generator_and_resume_restores_it(
    mps_here: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_data: Path
) -> None:
    """torch.mps.get_rng_state/set_rng_state run as they are; only the generator they find is a CPU one, since
    this machine has no MPS generator. A CPU run never draws from it, so its state must come back exactly."""
    generator = torch.Generator().manual_seed(7)
    torch.rand(3, generator=generator)  # a state no seeding gives
    monkeypatch.setattr(torch.mps, "_get_default_mps_generator", lambda: generator)
    out = tmp_path / "out"
    train.main(tiny_args(tiny_data, out, "--max_iters=2"))
    saved = load_checkpoint(out / "ckpt.pt")["rng"]["mps"]
    assert torch.equal(saved, generator.get_state())

    generator.manual_seed(1337)  # what a new process's torch.manual_seed(seed) does to the MPS generator
    train.main([f"--out_dir={out}", "--init_from=resume", "--max_iters=3"])
    assert torch.equal(generator.get_state(), saved)  # (and saved again as it is: the first save's code)

    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)  # the same checkpoint on a PC
    train.main([f"--out_dir={out}", "--init_from=resume", "--max_iters=4"])
    assert "mps" not in load_checkpoint(out / "ckpt.pt")["rng"]


# ---- prepare.py's download on python.org's Python for macOS ----


def test_a_certificate_failure_names_the_cause_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
) -> None:
    def no_certificates(self: http.client.HTTPSConnection) -> None:  # the TLS handshake, as it fails there
        raise ssl.SSLCertVerificationError(1, f"{CERT_ERROR} (_ssl.c:1000)")

    monkeypatch.setattr(http.client.HTTPSConnection, "connect", no_certificates)  # urllib wraps it in a URLError
    script = str(ROOT / "data" / "shakespeare_char" / "prepare.py")
    errors = []
    for url in ("https://example.org/input.txt", (tmp_path / "missing.txt").as_uri()):  # the other: no certificates
        args = ["--out_dir", str(tmp_path), "--url", url]
        assert run_prepare(args, description=None, script_file=script, make_tokenizer=CharTokenizer.from_text) == 1
        errors.append(capsys.readouterr().err.strip())
    msg, other = errors  # the cause and its fix; for a failure of another kind, neither
    assert CERT_ERROR in msg and "Install Certificates.command" in msg, msg
    assert "CERTIFICATE" not in other and "Certificates" not in other, other


# ---- benchmarks and memory on MPS ----


@pytest.mark.parametrize("device", ["mps", "mps:0"])
def test_timings_wait_for_the_apple_gpu_and_peak_memory_is_the_drivers_figure(
    device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: 3 * 2**30)
    assert peak_memory(device) == 3 * 2**30
    events = []
    monkeypatch.setattr(torch.mps, "synchronize", lambda: events.append("synchronize"))
    common.timed(lambda: events.append("work"), device, calls=2)
    assert events == ["synchronize", "work", "work", "synchronize"]  # queued work before the clock is read


@pytest.mark.parametrize("device", ["mps", "mps:0"])
def test_decoding_leaves_out_the_mode_where_it_refuses_the_device_and_refuses_the_mode_alone(
    device: str, mps_here: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert decoding.paths_here(list(decoding.PATHS), device) == ["uncached", "cached", "linears"]
    line = capsys.readouterr().out.strip()
    assert len(line.splitlines()) == 1 and line.startswith("leaving out path 'mode': ") and device in line, line
    argv = ["--device", device, "--paths", "mode", "--sizes", "configs/shakespeare_char_cpu.json"]
    err = assert_one_line_error(command(capsys, decoding.main, argv), 1, device)
    assert err.startswith("error: --paths mode cannot run here: ")
