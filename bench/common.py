"""Helpers shared by the benchmark scripts: running train.py (ours or nanoGPT's) in a child process, parsing its
log lines and metrics.jsonl, describing the machine, and writing Markdown tables.

Every measurement of a training step runs in a fresh child process, so one run's allocator state, thread pools and
compiled kernels never leak into the next, and the child's peak resident memory can be read from the kernel
(`os.wait4` gives the rusage of exactly that child).
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# Log lines. Ours (CONTRACTS.md): "iter 12: loss 2.3456, lr 1.00e-03, 38.12 ms/iter, 20145 tok/s".
# nanoGPT's train.py: "iter 12: loss 2.3456, time 38.12ms, mfu 0.02%". Both print evals as
# "step 250: train loss 1.2345, val loss 1.3456".
OURS_ITER_RE = re.compile(r"^iter (\d+): loss ([-+\d.eEnaif]+), lr [^,]+, ([\d.]+) ms/iter, ([\d.]+) tok/s")
NANOGPT_ITER_RE = re.compile(r"^iter (\d+): loss ([-+\d.eEnaif]+), time ([\d.]+)ms")
EVAL_RE = re.compile(r"^step (\d+): train loss ([-+\d.eEnaif]+), val loss ([-+\d.eEnaif]+)")


@dataclass
class RunResult:
    """What one child process did: its exit code, output, wall time and peak resident memory."""

    cmd: list[str]
    returncode: int
    lines: list[str]
    wall_s: float
    max_rss_bytes: int | None
    timed_out: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def tail(self, n: int = 20) -> str:
        return "\n".join(self.lines[-n:])


def _maxrss_to_bytes(ru_maxrss: int) -> int:
    # Linux reports ru_maxrss in KiB, macOS in bytes.
    return ru_maxrss if sys.platform == "darwin" else ru_maxrss * 1024


def run_child(
    cmd: Sequence[str],
    *,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    prefix: str | None = None,
    timeout_s: float | None = None,
    echo: bool = True,
) -> RunResult:
    """Run cmd, streaming its merged stdout/stderr line by line (prefixed), and return its RunResult.

    The child is reaped with os.wait4 so that its own peak RSS (ru_maxrss) is known; a child that outlives
    timeout_s is killed and marked timed_out.
    """
    full_env = dict(os.environ)
    full_env["PYTHONUNBUFFERED"] = "1"  # lines arrive as they are printed, not at exit
    if env:
        full_env.update(env)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        list(cmd),
        cwd=cwd,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )
    lines: list[str] = []
    killed = threading.Event()

    def _kill() -> None:
        killed.set()
        proc.kill()

    # The timer kills a child that outlives timeout_s even if it has gone silent.
    timer = threading.Timer(timeout_s, _kill) if timeout_s is not None else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    assert proc.stdout is not None
    try:
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            lines.append(line)
            if echo:
                print(f"[{prefix}] {line}" if prefix else line, flush=True)
    finally:
        if timer is not None:
            timer.cancel()
    proc.stdout.close()
    _, status, rusage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # tell Popen the child is reaped
    wall = time.perf_counter() - t0
    return RunResult(
        cmd=list(cmd),
        returncode=proc.returncode,
        lines=lines,
        wall_s=wall,
        max_rss_bytes=_maxrss_to_bytes(rusage.ru_maxrss),
        timed_out=killed.is_set(),
    )


def parse_iter_times(lines: Iterable[str], style: str) -> dict[int, float]:
    """iteration -> ms/iter from log lines; style 'ours' or 'nanogpt'."""
    if style not in ("ours", "nanogpt"):
        raise ValueError(f"style must be 'ours' or 'nanogpt', got {style!r}")
    pattern = OURS_ITER_RE if style == "ours" else NANOGPT_ITER_RE
    out: dict[int, float] = {}
    for line in lines:
        m = pattern.match(line.strip())
        if m:
            out[int(m.group(1))] = float(m.group(3))
    return out


def parse_evals(lines: Iterable[str]) -> list[dict[str, float]]:
    """Eval lines -> [{'iter', 'train_loss', 'val_loss'}, ...] in order."""
    evals = []
    for line in lines:
        m = EVAL_RE.match(line.strip())
        if m:
            evals.append({"iter": int(m.group(1)), "train_loss": float(m.group(2)), "val_loss": float(m.group(3))})
    return evals


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a metrics.jsonl file ([] if it does not exist); a torn last line is ignored."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a run killed mid-write leaves a partial line
    return records


def timed_iter_keys(
    times: dict[int, float], eval_iters: Iterable[int], warmup: int, n_timed: int | None = None
) -> list[int]:
    """The iterations whose times count: drop the first `warmup` logged ones, then every one that ran an eval,
    and keep at most n_timed of the rest.

    Warmup is counted in logged iterations, whatever number the log starts at. The first iterations are slow
    (allocator and thread pools warming up; in nanoGPT's loop iteration 0's time also contains the first eval),
    and an iteration during which an eval ran measures the eval.
    """
    skip = set(eval_iters)
    keys = [i for i in sorted(times)[warmup:] if i not in skip]
    return keys if n_timed is None else keys[:n_timed]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def spread(values: Sequence[float]) -> tuple[float, float]:
    return (min(values), max(values)) if values else (math.nan, math.nan)


def machine_info() -> dict[str, Any]:
    """CPU model and cores, GPU name, and the versions that matter for the figures."""
    info: dict[str, Any] = {
        "commit": _git_commit(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
    }
    if hasattr(os, "sched_getaffinity"):
        info["cpus_usable"] = len(os.sched_getaffinity(0))
    info["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS")
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        info["cuda"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["cuda_version"] = torch.version.cuda
    except ImportError:
        info["torch"] = None
    info["triton"] = _package_version("triton")
    info["numpy"] = _package_version("numpy")
    return info


def _git_commit() -> str | None:
    """The commit measured (with '+changes' when the working tree differs from it), or None outside git."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", str(root), "diff", "--quiet", "HEAD", "--", "*.py"], capture_output=True)
    except OSError:
        return None
    return head.stdout.strip() + ("+changes" if dirty.returncode else "") if head.returncode == 0 else None


def _package_version(name: str) -> str | None:
    # importlib.metadata reads the version without importing the package (importing triton is slow and
    # would fix TRITON_INTERPRET for this process).
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub Markdown table; floats are shown as given (format them before)."""
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        out.append("| " + " | ".join("" if v is None else str(v) for v in row) + " |")
    return "\n".join(out)


def fmt(value: float | None, spec: str = ".2f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return format(value, spec)


def fmt_mib(n_bytes: float | None) -> str:
    return "n/a" if n_bytes is None else f"{n_bytes / 2**20:.0f} MiB"


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0 or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def load_config(name_or_path: str) -> dict[str, Any]:
    """configs/<name>.json (or a path to a JSON config) as a dict."""
    path = Path(name_or_path)
    if not path.suffix:
        path = ROOT / "configs" / f"{name_or_path}.json"
    if not path.exists():
        available = sorted(p.stem for p in (ROOT / "configs").glob("*.json"))
        raise SystemExit(f"config {name_or_path!r} not found at {path}; available: {available}")
    return json.loads(path.read_text(encoding="utf-8"))


def config_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    return path if path.suffix else ROOT / "configs" / f"{name_or_path}.json"


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """['n_layer=2', 'bias=False'] -> {'n_layer': 2, 'bias': False} (JSON values, else the string)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set expects key=value, got {item!r}")
        lowered = {"true": True, "false": False}.get(value.lower())
        if lowered is not None:
            out[key] = lowered
            continue
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, default=str) + "\n", encoding="utf-8")
