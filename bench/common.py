"""What the benchmarks share (bench/README.md); torch is imported where it is used, so that the packing takes none.

python -m bench.common RESULTS_DIR OUT_DIR    # bench/gpu.sh, after every step: RESULTS_DIR as the files of PACKED
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from machinery.command import ArgumentParser
from machinery.measure import machine_info, markdown_table

ROOT = Path(__file__).resolve().parents[1]
PACKED = ("summary.md", "results.json", "gpu_results.tar.gz")  # what bench/gpu.sh leaves in its output folder


@dataclass
class Child:
    """One finished child process: exit code, output lines, wall time, peak resident memory (its own, from wait4);
    whether it was killed at its time limit, or because this process was interrupted (SIGINT) while it ran."""

    returncode: int
    lines: list[str]
    wall_s: float
    max_rss_bytes: int
    timed_out: bool
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.interrupted


class Interrupts:
    """SIGINT while a benchmark runs (Ctrl-C; or bench/gpu.sh's time limit, which timeout sends twice, to the
    benchmark and to its process group), as a `with` block in the main thread: every signal only sets `seen` and
    kills the child that `child` names, if any, so that none can land halfway through a write of the results; the
    benchmark looks at `seen` and stops. Blocks nest: the inner one sees the signals while it is open."""

    def __init__(self) -> None:
        self.seen = False
        self.child: subprocess.Popen | None = None
        self._previous: Any = None

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum: int, frame: object) -> None:
        self.seen = True
        if self.child is not None:
            kill_unreaped(self.child)


def kill_unreaped(proc: subprocess.Popen) -> None:
    """SIGKILL to proc by its pid: Popen.kill() would poll() first, and so reap a child that has just ended, which
    run_child's os.wait4 must do (for its peak memory)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGKILL)


def run_child(cmd: Sequence[str], cwd: Path = ROOT, timeout_s: float | None = None, echo: str | None = None) -> Child:
    """Run cmd with its output merged and read line by line (echoed with the prefix `echo`, if given); a child that
    outlives timeout_s is killed, and so is the child of an interrupted benchmark (SIGINT: Ctrl-C, or bench/gpu.sh's
    time limit), which then returns what it has. os.wait4 reaps it, so ru_maxrss is this child's peak
    (bench/README.md)."""
    from machinery.device import maxrss_bytes

    with Interrupts() as interrupts:
        proc = subprocess.Popen(
            list(cmd),
            cwd=cwd,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        interrupts.child = proc
        if interrupts.seen:  # (a signal before it was named)
            kill_unreaped(proc)
        killed = threading.Event()
        timer = threading.Timer(timeout_s or 0, lambda: (killed.set(), kill_unreaped(proc)))
        if timeout_s:
            timer.start()  # kills a child that has gone silent, too
        t0 = time.perf_counter()
        lines = []
        for raw in proc.stdout:  # (until the child ends, or is killed)
            lines.append(raw.rstrip("\n"))
            if echo is not None:
                print(f"[{echo}] {lines[-1]}", flush=True)
        timer.cancel()
        proc.stdout.close()
        _, status, rusage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # tell Popen the child is reaped
    wall = time.perf_counter() - t0
    return Child(proc.returncode, lines, wall, maxrss_bytes(rusage.ru_maxrss), killed.is_set(), interrupts.seen)


def parser(description: str, config: bool = False) -> argparse.ArgumentParser:
    """The options every benchmark has (--device, --out) and, with config, train.py's (--config, --set)."""
    from machinery.device import DEVICE_HELP

    p = ArgumentParser(description=description.split("\n\n")[0])
    if config:
        p.add_argument("--config", default="configs/shakespeare_char_cpu.json", help="a train.py config file")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a train.py option")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument("--out", type=Path, help="results as JSON here, the table as .md beside it")
    return p


def parse(p: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """p's arguments, with args.argv (the command line, for write_results) and args.device resolved (a device that
    is not here is a one-line usage error)."""
    from machinery.device import DeviceError, resolve_device

    args = p.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args.device = resolve_device(args.device)
    except DeviceError as e:
        p.error(str(e))
    out = getattr(args, "out", None)
    if out is not None:  # before any measuring: a path that cannot take the results
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            p.error(f"--out {out}: its folder cannot be created ({e.strerror or e})")
        if out.is_dir() or not os.access(out.parent, os.W_OK):
            p.error(f"--out {out}: {'a folder' if out.is_dir() else 'its folder is not writable'}; give a file path")
    return args


def timed(fn: Callable[[], Any], device: str, calls: int = 1) -> float:
    """Seconds per call of fn, over `calls` calls; on a GPU (CUDA, MPS), the queued work included (synchronize)."""
    import torch

    kind = torch.device(device).type
    sync = torch.cuda.synchronize if kind == "cuda" else torch.mps.synchronize if kind == "mps" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) / calls


def comma_list(choices: Sequence[str] | None = None) -> Callable[[str], list]:
    """An argparse type: 'a,b' -> ['a', 'b'], each one of choices; without choices, positive integers."""

    def parse(text: str) -> list:
        items = [v for v in text.split(",") if v] if choices else text.split(",")
        bad = [v for v in items if (v not in choices if choices else not (v.isdigit() and int(v) >= 1))]
        if bad:
            what = f"one of {', '.join(choices)}" if choices else "a positive integer"
            raise argparse.ArgumentTypeError(f"{bad[0]!r} is not {what}")
        return items if choices else [int(v) for v in items]

    return parse


def at_least(least: float, kind: type = int) -> Callable[[str], Any]:
    """An argparse type: a `kind` (int or float) that is >= least; NaN is refused too."""

    def number(text: str) -> Any:
        value = kind(text)  # (a text kind() refuses: argparse's "invalid int value: 'x'", as with type=int)
        if not value >= least:
            raise argparse.ArgumentTypeError(f"must be >= {least}, got {text}")
        return value

    number.__name__ = kind.__name__
    return number


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def spread(values: Sequence[float]) -> list[float] | None:
    return [min(values), max(values)] if values else None


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "n/a" if value is None else format(value, spec)


def write_results(args: argparse.Namespace, module: str, result: dict[str, Any], table: str) -> None:
    """With --out: the result as JSON there, with the machine and the command (python -m module); the table beside."""
    if not args.out:
        return
    result = {"command": ["python", "-m", module, *args.argv], "machine": machine_info(), **result}
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
    args.out.with_suffix(".md").write_text(table + "\n", encoding="utf-8")


def report(args: argparse.Namespace, module: str, result: dict[str, Any], table: str) -> dict[str, Any]:
    """A benchmark's end: its table printed after a blank line, written with the result (write_results); the result."""
    print("\n" + table)
    write_results(args, module, result, table)
    return result


def pack(res: Path, out: Path) -> None:
    """bench/gpu.sh's results so far as PACKED (bench/README.md). Each file is written beside its name and then
    renamed, so a run cut at any moment leaves whole files."""
    steps = [line.split("\t") for line in (res / "steps.tsv").read_text().splitlines()]
    results = {"steps": [dict(zip(("step", "rc", "seconds", "limit_s"), s, strict=True)) for s in steps]}
    for path in sorted(res.glob("*.json")):
        try:
            results[path.stem] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # not (yet) whole JSON, as a step's file cut short by its time limit
            results[path.stem] = None
    machine = results.get("machine") or {}
    plan = (res / "plan.txt").read_text(encoding="utf-8").strip() if (res / "plan.txt").exists() else ""
    versions = f"{machine.get('gpu') or 'no GPU'}, torch {machine.get('torch')}, triton {machine.get('triton')}"
    summary = [
        f"# bench/gpu.sh at commit {machine.get('commit') or 'unknown (no git, no --commit)'}",
        "",
        versions,
        "",
        *([plan, ""] if plan else []),
        markdown_table(["step", "exit", "seconds", "limit s"], steps),
    ]
    for name, *_ in steps:
        if (res / f"{name}.md").exists():
            summary += ["", f"## {name}", "", (res / f"{name}.md").read_text(encoding="utf-8").strip()]
        elif (res / f"{name}.log").exists():
            tail = (res / f"{name}.log").read_text(encoding="utf-8", errors="replace").strip().splitlines()[-25:]
            summary += ["", f"## {name}", "", "```", *tail, "```"]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{PACKED[0]}.part").write_text("\n".join(summary) + "\n", encoding="utf-8")
    (out / f"{PACKED[1]}.part").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    with tarfile.open(out / f"{PACKED[2]}.part", "w:gz") as tar:
        tar.add(res, arcname="gpu_results")
    for name in PACKED:
        os.replace(out / f"{name}.part", out / name)


if __name__ == "__main__":
    if len(sys.argv) != 3 or not Path(sys.argv[1], "steps.tsv").exists():
        sys.exit(f"usage: python -m bench.common RESULTS_DIR (holding steps.tsv) OUT_DIR; got {sys.argv[1:]}")
    pack(Path(sys.argv[1]), Path(sys.argv[2]))
