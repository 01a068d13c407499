"""Where a run computes: the device (--device), the autocast dtype (--dtype) and this process's place among
torchrun's processes. train.py, sample.py and batch_independence.py all choose their device here, by one rule."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


class DeviceError(ValueError):
    """The asked-for device or dtype is not there; the message says what is valid."""


@dataclass
class Dist:
    """Where this process stands among the torchrun processes (one process: rank 0 of 1)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def master(self) -> bool:
        return self.rank == 0


def dist_from_env() -> Dist:
    """torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; a plain `python train.py` sets none of them."""
    if "RANK" not in os.environ:
        return Dist()
    return Dist(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)))


def resolve_device(name: str, dist: Dist | None = None) -> str:
    """The torch device string for --device ('auto': cuda, then mps, then cpu); DeviceError if it is not here."""
    dist = dist or Dist()
    if name == "auto":
        if torch.cuda.is_available():
            name = "cuda"
        elif torch.backends.mps.is_available() and not dist.enabled:
            name = "mps"
        else:
            name = "cpu"
    try:
        kind = torch.device(name).type
    except RuntimeError:
        kind = None
    if kind not in ("cpu", "cuda", "mps"):
        raise DeviceError(f"device={name!r} is not a device here; choose auto, cpu, cuda, cuda:N or mps")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                f"device={name!r} but CUDA is not available here (torch {torch.__version__}); "
                f"use --device=cpu or --device=auto"
            )
        if dist.enabled:
            name = f"cuda:{dist.local_rank}"  # one GPU per process
        if (torch.device(name).index or 0) >= torch.cuda.device_count():
            raise DeviceError(f"device={name!r} but there are only {torch.cuda.device_count()} CUDA devices")
    elif name == "mps":
        if not torch.backends.mps.is_available():
            raise DeviceError("device='mps' but MPS is not available here; use --device=cpu or --device=auto")
        if dist.enabled:
            raise DeviceError("several processes (torchrun) are supported on CUDA (nccl) and CPU (gloo), not MPS")
    return name


def resolve_dtype(name: str, device_type: str) -> str:
    """The autocast dtype for --dtype ('auto': bfloat16 on a GPU that has it, else float32)."""
    if name == "auto":
        return "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if name == "bfloat16" and device_type == "cuda" and not torch.cuda.is_bf16_supported():
        raise DeviceError("dtype='bfloat16' is not supported by this GPU; use --dtype=float16 or --dtype=float32")
    return name
