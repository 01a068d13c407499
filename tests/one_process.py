"""Runs the docs' commands one after another, each in a process of its own forked from this one, which has imported
torch and torch._dynamo (which imports triton) and nothing of the repository: each is a fresh `python` that has
already paid for those imports, 3 s of CPU. Kept because nothing else keeps the suite's time: the docs' 24 commands
(`time python -m pytest -q -n 0 tests/test_readme_commands.py`, on the suite's two-core machine, shared) took
101 s with a subprocess.run per command and 40 s forked from here (37 to 47 s with the runner before it, which
emulated a fresh interpreter inside one process); calling each script's main(argv) in the test's process would run
the checkout's modules, which find data/ and bench/ beside their own files, not the fresh copy's.

    python tests/one_process.py COMMANDS RESULTS.jsonl

COMMANDS, in JSON: {"commands": [{"argv": ["train.py", "--max_iters=2"], "env": {"TRITON_INTERPRET": "1"}}, ...],
"watch": "PATH"}; `-m MODULE` runs a module. RESULTS.jsonl gets a line per command: its exit status, what it wrote
to stderr (its child processes' too), and the sha256 of the watched file (or null) once it has run.
"""

from __future__ import annotations

import hashlib
import json
import os
import runpy
import sys
import traceback
from pathlib import Path

# The point: torch imported once, before any fork; with torch._dynamo, whose 1.2 s every train.py run spends, and
# which imports triton where it is installed (triton reads TRITON_INTERPRET when a kernel is defined, not then).
import torch._dynamo  # noqa: F401


def exit_status(code: object) -> int:
    """What `python` exits with for sys.exit(code): None is 0, an int itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def run(argv: list[str], env: dict[str, str], stderr: Path) -> None:
    """In the forked child: `python *argv` with `env` set and its stderr written to `stderr`; never returns. It ends
    without the interpreter's teardown, which a fresh `python` would spend a second on (no script here registers an
    atexit function)."""
    os.environ.update(env)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    os.dup2(os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    code = 1
    try:
        if argv[0] == "-m":
            sys.argv = argv[1:]  # run_module puts the module's file in sys.argv[0]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv
            sys.path[0] = str(Path(argv[0]).resolve().parent)
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as e:
        code = exit_status(e.code)
    except BaseException:  # what an uncaught exception does to a process: its traceback, exit status 1
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    spec = json.loads(sys.argv[1])
    results, watch = Path(sys.argv[2]), Path(spec["watch"])
    stderr = results.with_suffix(".stderr")
    with open(results, "w", encoding="utf-8") as out:
        for command in spec["commands"]:
            pid = os.fork()
            if pid == 0:
                run(command["argv"], command["env"], stderr)
            code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            digest = hashlib.sha256(watch.read_bytes()).hexdigest() if watch.is_file() else None
            err = stderr.read_text(encoding="utf-8", errors="replace")
            out.write(json.dumps({"code": code, "stderr": err, "watch": digest}) + "\n")
            out.flush()  # before the next fork, and read by the test if this process is stopped


if __name__ == "__main__":
    main()
