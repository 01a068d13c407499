"""python -m exercises [N] [--explain] [--time-limit S]: grade every exercise, or exercise N, and print PASS or the
first mistake for each; with --explain, print what the checker tries instead.

Each exercise is graded in a process of its own, so that code which ends that process (os._exit), crashes it (a
segfault) or never returns (given S seconds, 60 unless --time-limit says otherwise) is named, not graded, and
counted as failed.

Exit status: 0 when every exercise graded passes (one that cannot run here, the Triton one without triton, is
skipped, saying why), 1 otherwise, 2 for an argument that is not an exercise, --explain or --time-limit S (S a
positive number of seconds), 130 when grading is interrupted (Ctrl-C, or a KeyboardInterrupt raised by an exercise).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

try:
    from exercises import check
except KeyboardInterrupt:  # Ctrl-C while torch is imported, before any grading
    print("interrupted before grading began", file=sys.stderr)
    sys.exit(130)
except Exception as error:  # the checker deleted or edited: one line, no traceback
    why = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    sys.exit(f"error: exercises/check.py, the checker, cannot be imported ({why}): copy it back from the repository")

FILES = {
    1: "ex1_layer_norm_1d",
    2: "ex2_layer_norm",
    3: "ex3_variance",
    4: "ex4_backward",
    5: "ex5_triton_forward",
    6: "ex6_per_token",
    7: "ex7_rms_norm",
    8: "ex8_kv_cache",
}
# Seconds for one exercise's process, torch's import included: the slowest solution's takes 2 s on a 2-core CPU,
# and up to 9 s with both cores busy with other work
TIME_LIMIT = 60.0


def grade(n: int, package: str = "exercises") -> str:
    """Exercise n of package (the learner's, or exercises.solutions) graded: PASS or the first mistake."""
    if n in check.TRITON_EXERCISES and (why := check.triton_unavailable()) is not None:
        return f"{check.SKIPPED}: {why}"
    try:
        module = importlib.import_module(f"{package}.{FILES[n]}")
    except SystemExit as stop:
        return f"{FILES[n]}.py calls sys.exit({stop.code!r}) when it is imported: remove it; the grader calls your code"
    except Exception as error:  # a syntax error in the learner's file, say: one line, no traceback
        return f"{FILES[n]}.py does not import: {check.in_one_line(error)}"
    return check.CHECKS[n](module)


def grade_into(n: int, package: str, path: str) -> None:
    """The child process of graded_apart: exercise n graded, its result written to path; exit status 130 for a
    KeyboardInterrupt raised by the learner's code. It ends itself if the grader does (a closed terminal, a kill):
    in a session of its own, nothing else would stop an endless loop."""
    parent = os.getppid()
    threading.Thread(target=end_with_parent, args=(parent,), daemon=True).start()
    try:
        result = grade(n, package)
    except KeyboardInterrupt:
        sys.exit(130)
    Path(path).write_text(result, encoding="utf-8")


def end_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def graded_apart(n: int, package: str, time_limit: float) -> str:
    """Exercise n graded by grade in a child process: PASS, the first mistake, or why the child gave no result (it
    ended, crashed, or ran past time_limit seconds). A KeyboardInterrupt raised in the child is raised here."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "result"
        code = f"from exercises.__main__ import grade_into; grade_into({n}, {package!r}, {str(path)!r})"
        env = {"TRITON_INTERPRET": "1", **os.environ}  # as the __main__ block sets it, before triton is imported
        env["PYTHONUNBUFFERED"] = "1"  # what the learner's code prints shows even if it is then killed
        # A session of its own: Ctrl-C reaches this process only, and the child and all it started die as one.
        # No stdin: a process outside the terminal's foreground group that reads it is stopped, silently.
        child = subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdin=subprocess.DEVNULL, start_new_session=True
        )
        try:
            status = child.wait(timeout=time_limit)
        except subprocess.TimeoutExpired:
            status = None
        finally:
            if child.returncode is None:  # past the time limit, or Ctrl-C
                kill(child)
            kill_orphans()
        if path.exists():  # graded, even if the child then failed to end
            return path.read_text(encoding="utf-8")
    if status is None:
        why = "an endless loop in your code? if it is only slow, give --time-limit S"
        return f"no result after {time_limit:g} s ({why}): not graded"
    if status == 130:  # grade_into's KeyboardInterrupt
        raise KeyboardInterrupt
    if status < 0:
        return f"crashed ({signal_name(-status)}) while your code ran: not graded"
    return f"your code ended the grader's process (exit status {status}) before it was graded: not graded"


def adopt_orphans() -> bool:
    """Linux: make this process the one a grandchild is handed to when its parent ends (a child subreaper), so that
    a process the learner's code starts in a session of its own, out of reach of kill's process group, is still
    ours to end (kill_orphans). Elsewhere nothing: such a process may outlive the grader."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    PR_SET_CHILD_SUBREAPER = 36  # prctl(2)
    return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def kill_orphans() -> None:
    """Every process this one has been handed (adopt_orphans) since the child it started ended: killed and reaped."""
    while pids := [int(p) for f in Path("/proc/self/task").glob("*/children") for p in f.read_text().split()]:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def kill(child: subprocess.Popen) -> None:
    """The child and every process it started: its process group, as start_new_session made it (Windows has none:
    the child alone)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # it ended (macOS: a group of one zombie)
        if hasattr(os, "killpg"):
            os.killpg(child.pid, signal.SIGKILL)
        else:
            child.kill()
    child.wait()


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a signal Python has no name for (a real-time one)
        return f"signal {number}"


def parsed(args: list[str]) -> tuple[list[int], bool, float] | None:
    """(the exercises to grade, --explain given, the time limit) from the arguments; None if they are not valid."""
    rest = list(args)
    time_limit = TIME_LIMIT
    if "--time-limit" in rest:
        at = rest.index("--time-limit")
        try:
            time_limit = float(rest[at + 1])
        except (IndexError, ValueError):
            return None
        del rest[at : at + 2]
    numbers = [a for a in rest if a != "--explain"]
    valid = [str(n) for n in FILES]
    if len(numbers) > 1 or (numbers and numbers[0] not in valid) or rest.count("--explain") > 1:
        return None
    if not 0 < time_limit < math.inf:  # nan fails it too
        return None
    return ([int(numbers[0])] if numbers else list(FILES)), "--explain" in rest, time_limit


def main(argv: Sequence[str] | None = None, package: str = "exercises", in_process: bool = False) -> int:
    """python -m exercises ARGV, grading package's files, each in a child process (in this one with in_process)."""
    args = list(sys.argv[1:] if argv is None else argv)
    options = parsed(args)
    if options is None:
        print(
            f"usage: python -m exercises [N] [--explain] [--time-limit S], N one of {', '.join(map(str, FILES))}, "
            f"S a number of seconds above 0 (default {TIME_LIMIT:g}); got {' '.join(args)}",
            file=sys.stderr,
        )
        return 2
    chosen, explain, time_limit = options
    if explain:
        for n in chosen:
            print(f"exercise {n} ({FILES[n]}.py): {check.explain(n)}")
        return 0
    failed = 0
    if not in_process:
        adopt_orphans()
    for n in chosen:
        try:
            result = grade(n, package) if in_process else graded_apart(n, package, time_limit)
        except KeyboardInterrupt:
            why = "interrupted (Ctrl-C, or a KeyboardInterrupt raised by your code): not graded"
            print(f"exercise {n} ({FILES[n]}.py): {why}", flush=True)
            return 130
        print(f"exercise {n} ({FILES[n]}.py): {result}", flush=True)
        failed += result != check.PASS and not result.startswith(check.SKIPPED)
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: exercise 5 runs on the CPU
    try:
        sys.exit(main())
    except OSError as e:  # stdout on a full disk, or closed
        sys.exit(f"error: the results cannot be printed ({e.strerror or e})")
