"""device.resolve_device: each device a user may name is either returned or refused in one line that says what to
use instead."""

from __future__ import annotations

import signal

import pytest
import torch

from machinery.device import DeviceError, Dist, joining, resolve_device


@pytest.mark.parametrize(
    ("cuda", "mps", "processes", "expected"),
    [
        (True, True, 1, "cuda"),
        (False, True, 1, "mps"),
        (False, True, 2, "cpu"),
        (False, False, 1, "cpu"),
        (True, False, 2, "cuda:1"),  # rank 1 of 2 takes its own GPU
    ],
)
def test_auto_prefers_cuda_then_mps_then_cpu(
    monkeypatch: pytest.MonkeyPatch, cuda: bool, mps: bool, processes: int, expected: str
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2 if cuda else 0)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    assert resolve_device("auto", Dist(rank=processes - 1, local_rank=processes - 1, world_size=processes)) == expected


NO_MPS = pytest.mark.skipif(torch.backends.mps.is_available(), reason="MPS is available here")
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        *[(name, "is not a device here; choose auto, cpu") for name in ("nonsense", "tpu", "cuda:x")],
        *[
            pytest.param(name, "but MPS is not available here; use --device=cpu", marks=NO_MPS)
            for name in ("mps", "mps:0")
        ],
        *[pytest.param(name, "but CUDA is not available here", marks=NO_CUDA) for name in ("cuda", "cuda:1")],
    ],
)
def test_a_device_that_is_not_here_is_refused_saying_what_to_use(name: str, message: str) -> None:
    with pytest.raises(DeviceError, match=f"device={name!r} {message}"):
        resolve_device(name)


@pytest.mark.parametrize(
    ("cuda", "name", "last", "message"),
    [(True, "cuda:2", "cuda:1", "there are only 2 CUDA devices"), (False, "mps:1", "mps:0", "there is one MPS device")],
)
def test_a_device_index_past_the_last_device_is_refused_up_front(
    monkeypatch: pytest.MonkeyPatch, cuda: bool, name: str, last: str, message: str
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: not cuda)
    with pytest.raises(DeviceError, match=f"device={name!r} but {message}"):
        resolve_device(name)
    assert resolve_device(last) == last


def test_a_wait_for_the_other_processes_that_torch_gives_up_is_one_line_saying_what_to_do(monkeypatch):
    """torch's rendezvous gives up after 30 minutes (DistStoreError): one line, not its traceback; and Ctrl-C
    during the wait is SIGINT's default (fatal at once), restored after it."""
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.9")
    monkeypatch.setenv("MASTER_PORT", "29500")
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(DeviceError) as e, joining(Dist(rank=1, local_rank=1, world_size=2)):
        assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL
        raise torch.distributed.DistStoreError("Timed out after 1801 seconds waiting for clients. 1/2 clients joined.")
    assert str(e.value) == (
        "rank 1: the processes of this run (WORLD_SIZE=2) did not all join at 10.0.0.9:29500 (Timed out after 1801 "
        "seconds waiting for clients. 1/2 clients joined.): start all of them (torchrun starts them for you), or unset "
        "RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT to train in one process"
    )
    assert signal.getsignal(signal.SIGINT) is before
