"""Runs `python SCRIPT ARGS` and `python -m MODULE ARGS` commands one after another in this one process, each as a
fresh `python` would run it, and writes a JSON line per command: its argv, exit status, stderr, and the sha256 of
the watched file (or null) once it has run. Importing torch once instead of once per command is the point: the
docs' commands ran in 36 s this way and in 104 s with a new `python` for each (test_every_doc_command_runs_as_printed,
one run after the other on a two-core machine).

    python tests/one_process.py COMMANDS.json RESULTS.jsonl

COMMANDS.json: {"commands": [["train.py", "--max_iters=2"], ["-m", "bench.decoding"], ...], "watch": "PATH"}.

Each command starts from what a fresh process has: sys.argv and sys.path[0] as `python` sets them, the first
process's cwd and environment, no module of the repository imported (they are dropped after each command, so each
imports them anew, module-level state and all), a script as a fresh __main__ (runpy), the signal handlers, warning
filters, torch.nn.functional's functions and torch's global settings the process started with. What stays: third
party modules already imported (torch, numpy, triton), which read nothing from a script.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import runpy
import signal
import sys
import traceback
import warnings
from pathlib import Path

import torch
from torch.nn import functional as F


def _set_cudnn(allow_tf32: bool, benchmark: bool, deterministic: bool) -> None:
    torch.backends.cudnn.allow_tf32 = allow_tf32
    torch.backends.cudnn.benchmark = benchmark
    torch.backends.cudnn.deterministic = deterministic


def _set_cuda_tf32(allow: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = allow


# torch's process-wide settings a script may change: (read, write)
TORCH_SETTINGS = {
    "threads": (torch.get_num_threads, torch.set_num_threads),
    "grad": (torch.is_grad_enabled, torch.set_grad_enabled),
    "default dtype": (torch.get_default_dtype, torch.set_default_dtype),
    "deterministic": (
        lambda: (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()),
        lambda s: torch.use_deterministic_algorithms(s[0], warn_only=s[1]),
    ),
    "matmul precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    "cuda tf32": (lambda: torch.backends.cuda.matmul.allow_tf32, _set_cuda_tf32),
    "cudnn": (
        lambda: (torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic),
        lambda s: _set_cudnn(*s),
    ),
}


def torch_settings() -> dict[str, object]:
    return {name: read() for name, (read, _) in TORCH_SETTINGS.items()}


def restore_torch_settings(settings: dict[str, object]) -> None:
    for name, value in settings.items():
        read, write = TORCH_SETTINGS[name]
        if read() != value:
            write(value)


def exit_status(code: object) -> int:
    """What `python` exits with for sys.exit(code): None is 0, an int itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def run(argv: list[str]) -> tuple[int, str]:
    """`python *argv` in this process: its exit status and what it wrote to stderr."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err), warnings.catch_warnings():
        try:
            if argv[0] == "-m":
                sys.argv = [argv[1], *argv[2:]]  # run_module puts the module's file in sys.argv[0]
                sys.path[0] = os.getcwd()
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(argv)
                sys.path[0] = str(Path(argv[0]).resolve().parent)
                runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as e:
            code = exit_status(e.code)
        except BaseException:  # what an uncaught exception does to a process: its traceback, exit status 1
            traceback.print_exc()
            code = 1
    return code, err.getvalue()


def sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    results = Path(sys.argv[2])
    watch = Path(spec["watch"])
    cwd = os.getcwd()
    repository = Path(cwd).resolve()
    path = list(sys.path)
    environ = dict(os.environ)
    settings = torch_settings()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    functional = dict(vars(F))
    with open(results, "w", encoding="utf-8") as out:
        for argv in spec["commands"]:
            code, stderr = run(argv)
            for name, module in list(sys.modules.items()):
                file = getattr(module, "__file__", None)
                if name != "__main__" and file and Path(file).resolve().is_relative_to(repository):
                    del sys.modules[name]
            sys.path[:] = path
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(environ)
            restore_torch_settings(settings)
            for s, handler in handlers.items():
                signal.signal(s, handler)
            vars(F).update(functional)
            out.write(json.dumps({"argv": argv, "code": code, "stderr": stderr, "watch": sha256(watch)}) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
