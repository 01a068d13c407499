"""device.resolve_device: each device a user may name is either returned or refused in one line that says what to
use instead."""

from __future__ import annotations

import pytest
import torch

from device import DeviceError, resolve_device


def test_cpu_and_auto() -> None:
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") in ("cuda", "mps", "cpu")


@pytest.mark.parametrize("name", ["nonsense", "tpu", "cuda:x"])
def test_unknown_devices_are_refused(name: str) -> None:
    with pytest.raises(DeviceError, match=f"device={name!r} is not a device here; choose auto, cpu"):
        resolve_device(name)


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="MPS is available here")
@pytest.mark.parametrize("name", ["mps", "mps:0"])
def test_mps_where_there_is_none(name: str) -> None:
    with pytest.raises(DeviceError, match=f"device={name!r} but MPS is not available here; use --device=cpu"):
        resolve_device(name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_cuda_where_there_is_none(name: str) -> None:
    with pytest.raises(DeviceError, match=f"device={name!r} but CUDA is not available here"):
        resolve_device(name)
