"""Where a run computes (README.md's layout says what is here). train.py, sample.py and batch_independence.py all
choose their device here, by one rule."""

from __future__ import annotations

import gc
import os
import re
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from layernorm import TritonUnavailableError, check_triton_device
from machinery.command import BadOption, first_line

DEVICE_HELP = "auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps"  # what --device takes, everywhere


class DeviceError(BadOption, ValueError):
    """The asked-for device or dtype is not there; the message says what is valid."""


@dataclass
class Dist:
    """Where this process stands among the torchrun processes (one process: rank 0 of 1)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    control: Any = None  # the group for small agreements on the CPU (gloo); None: the default group

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def master(self) -> bool:
        return self.rank == 0

    def print(self, *args: Any, **kwargs: Any) -> None:
        """print() on rank 0 only: the other processes say the same."""
        if self.master:
            print(*args, **kwargs, flush=True)

    @contextmanager
    def use(self, device: str) -> Iterator[None]:
        """Compute on `device` for the duration, joined to the other processes (nccl on CUDA, gloo on the CPU). On
        CUDA it becomes this process's current device, TF32 matmuls are allowed and peak memory counts from here."""
        if device.startswith("cuda"):
            if torch.device(device).index is not None:  # 'cuda' alone is the current device already (and torch
                torch.cuda.set_device(device)  # 2.11 refuses to set it)
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            torch.cuda.reset_peak_memory_stats(device)
        if self.enabled:
            with joining(self):
                torch.distributed.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
            if device.startswith("cuda"):  # agreeing on a flag over gloo never waits for the GPU
                self.control = torch.distributed.new_group(backend="gloo")
        try:
            yield
        finally:
            if self.enabled:
                # A reference cycle keeps the DDP model, and gloo's threads, alive until shutdown, where they could
                # abort the process ("terminate called without an active exception": 3 of 60 runs; 0 of 100 with this)
                gc.collect()
                torch.distributed.destroy_process_group()

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` over every process, in place (one process: `t` as it is)."""
        if self.enabled:
            torch.distributed.all_reduce(t)
        return t


JOIN_NOTE_S = 10.0  # a wait for the other processes longer than this is said, with what to do


@contextmanager
def joining(dist: Dist) -> Iterator[None]:
    """The wait at the start for every process of the run (torch's rendezvous, in C++, deaf to Python's signal
    handlers): Ctrl-C ends the process at once (SIGINT's default action; there is nothing to save yet), and a wait
    past JOIN_NOTE_S is said on stderr, with how to stop it or avoid it."""
    world, at = f"(WORLD_SIZE={dist.world_size})", f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    how = (
        f"start all of them (torchrun starts them for you), or unset {', '.join(TORCHRUN_VARIABLES)} to train in one "
        f"process"
    )
    note = (
        f"rank {dist.rank}: still waiting, after {JOIN_NOTE_S:g} s, for the other processes of this run {world} at "
        f"{at}: {how}; Ctrl-C stops this one\n"
    )
    timer = threading.Timer(JOIN_NOTE_S, lambda: os.write(2, note.encode()))
    timer.daemon = True
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_DFL) if in_main else None
    timer.start()
    try:
        yield
    except torch.distributed.DistError as e:  # torch's time limit on the wait (30 min), or a peer gone
        raise DeviceError(
            f"rank {dist.rank}: the processes of this run {world} did not all join at {at} ({first_line(e)}): {how}"
        ) from None
    finally:
        timer.cancel()
        if in_main:
            signal.signal(signal.SIGINT, previous)


TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def dist_from_env() -> Dist:
    """torchrun sets all of TORCHRUN_VARIABLES; a plain `python train.py` sets none of them. DeviceError for some
    without the others, ranks that do not fit the world size, or a MASTER_ADDR that does not resolve."""
    given = [name for name in TORCHRUN_VARIABLES if name in os.environ]
    if not given:
        return Dist()
    if len(given) < len(TORCHRUN_VARIABLES):
        missing = [name for name in TORCHRUN_VARIABLES if name not in given]
        raise DeviceError(
            f"{', '.join(given)} set but not {', '.join(missing)}: start several processes with torchrun "
            f"(README.md), or unset {', '.join(given)} to run one"
        )
    numbers = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")
    if bad := [f"{name}={os.environ[name]!r}" for name in numbers if not os.environ[name].isdecimal()]:
        raise DeviceError(f"torchrun's {', '.join(numbers)} must be integers, got {', '.join(bad)}")
    rank, local_rank, world_size = (int(os.environ[name]) for name in TORCHRUN_VARIABLES[:3])
    if not (world_size >= 1 and 0 <= rank < world_size and 0 <= local_rank <= rank):
        raise DeviceError(
            f"RANK={rank}, LOCAL_RANK={local_rank}, WORLD_SIZE={world_size} do not fit: "
            f"need 0 <= LOCAL_RANK <= RANK < WORLD_SIZE"
        )
    if world_size > 1:
        try:  # else torch retries, warning, until its timeout
            socket.getaddrinfo(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
        except (OSError, UnicodeError) as e:
            raise DeviceError(
                f"MASTER_ADDR={os.environ['MASTER_ADDR']!r} cannot be resolved ({getattr(e, 'strerror', None) or e}): "
                f"give the address of the machine running RANK 0 (torchrun --standalone sets it for you)"
            ) from None
    return Dist(rank, local_rank, world_size)


def resolve_device(name: str, dist: Dist | None = None) -> str:
    """The torch device string for --device ('auto': cuda, then mps, then cpu); DeviceError if it is not here."""
    dist = dist or Dist()
    if name == "auto":
        mps = torch.backends.mps.is_available() and not dist.enabled
        name = "cuda" if torch.cuda.is_available() else "mps" if mps else "cpu"
    if not re.fullmatch(r"cpu|cuda(:\d+)?|mps(:\d+)?", name):  # (torch would take "cpu:5" as "cpu")
        raise DeviceError(f"device={name!r} is not a device here; choose auto, cpu, cuda, cuda:N or mps")
    kind = name.partition(":")[0]
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
    elif kind == "mps":  # "mps" or "mps:0"
        if not torch.backends.mps.is_available():
            raise DeviceError(f"device={name!r} but MPS is not available here; use --device=cpu or --device=auto")
        if dist.enabled:
            raise DeviceError("several processes (torchrun) are supported on CUDA (nccl) and CPU (gloo), not MPS")
        if torch.device(name).index:  # an Apple GPU is the one MPS device
            raise DeviceError(f"device={name!r} but there is one MPS device here; use --device=mps (or mps:0)")
    return name


def check_norm_device(norm: str, device: str) -> None:
    """DeviceError, saying what to do instead, if `norm` cannot run on `device` (the Triton norm without Triton or
    its GPU): before any data or model is loaded."""
    if norm == "triton":
        try:
            check_triton_device(device)
        except TritonUnavailableError as e:
            raise DeviceError(str(e)) from None


def resolve_dtype(name: str, device_type: str) -> str:
    """The autocast dtype for --dtype ('auto': bfloat16 on a GPU that has it, else float32)."""
    if name == "auto":
        return "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if name == "bfloat16" and device_type == "cuda" and not torch.cuda.is_bf16_supported():
        raise DeviceError("dtype='bfloat16' is not supported by this GPU; use --dtype=float16 or --dtype=float32")
    return name


def autocast(device: str, dtype: str, cache_enabled: bool = True) -> AbstractContextManager[Any]:
    """Mixed precision in `dtype` on `device` (a resolve_dtype name); float32 runs as it is. (cache_enabled=False
    while a CUDA graph is captured.)"""
    if dtype == "float32":
        return nullcontext()
    return torch.autocast(torch.device(device).type, dtype=getattr(torch, dtype), cache_enabled=cache_enabled)


def peak_memory(device: str) -> int:
    """CUDA: peak allocated by tensors. MPS: driver memory now. CPU: the process's peak resident set."""
    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_allocated(device))
    if torch.device(device).type == "mps" and hasattr(torch.mps, "driver_allocated_memory"):
        return int(torch.mps.driver_allocated_memory())
    return maxrss_bytes(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def maxrss_bytes(ru_maxrss: int) -> int:
    """rusage's ru_maxrss in bytes: macOS reports bytes, Linux kB (also for a child's rusage from os.wait4)."""
    return int(ru_maxrss if sys.platform == "darwin" else ru_maxrss * 1024)


class StopRequest:
    """SIGINT and SIGTERM while a run trains (a `with` block; in the main thread, the only one that may catch them).
    The first one only sets `signum`: the run finishes its iteration, saves a checkpoint and exits. A second within
    a second is the same request (torchrun forwards the terminal's Ctrl-C to processes that already got it); a
    later one raises KeyboardInterrupt: stop now, without saving. With catch=False (a run that saves nothing, such
    as eval_only), the signals are left as they are: the first Ctrl-C stops it."""

    def __init__(self, dist: Dist, catch: bool = True, saves: bool = True) -> None:
        self.dist = dist
        self.catch = catch
        self.saves = saves
        self.signum: int | None = None
        self._time = 0.0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if self.catch and threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def agreed(self, wall: bool) -> str | None:
        """'max_wall_s' or 'signal' once any process has passed its time limit or seen a signal, else None. Every
        process asks at every iteration, so all of them stop at the same one."""
        flags = [wall, self.signum is not None]
        if self.dist.enabled:  # (one process, asked at every iteration, builds no tensor)
            t = torch.tensor(flags, dtype=torch.float32)  # true on any process: their MAX, over the CPU group
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=self.dist.control)
            flags = [bool(v) for v in t.tolist()]
        wall, signalled = flags
        if signalled and self.signum is None:  # another process got it
            self.signum = signal.SIGINT
        return "max_wall_s" if wall else "signal" if signalled else None

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is not None:
            if time.monotonic() - self._time < 1.0:
                return
            signal.signal(signum, signal.SIG_DFL)
            raise KeyboardInterrupt
        self.signum = signum
        self._time = time.monotonic()
        if self.dist.master:  # one process of several says so
            what = "to save a checkpoint (Ctrl-C again to quit without saving)" if self.saves else "(Ctrl-C again: now)"
            os.write(2, f"\nstopping after this iteration {what}\n".encode())
