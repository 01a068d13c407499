"""Every command's front door: train.py, sample.py, batch_independence.py, export_gpt2.py, the prepare scripts, the
benchmarks and the experiments end through run_command (the grader, python -m exercises, keeps its own: a learner's
tree holds exercises/ and the two LayerNorm files, not machinery/). An expected failure is a Failure whose message
is one line that says what to do; run_command prints it on stderr and exits with its status (2 for a bad option, 1
for the rest, 128 + signal for a signal). Ctrl-C is 130 and a closed pipe (`| head`) ends quietly. Standard library
only, so that a command can import it before torch (see quiet_until_started)."""

from __future__ import annotations

import argparse
import errno
import os
import re
import signal
import sys
from collections.abc import Callable
from typing import NoReturn


class Failure(Exception):
    """An expected failure of a command: the input, a file or the machine, never a bug. Its message is one line."""

    status = 1


class BadOption(Failure):
    """What the user typed is not valid (an option, a config file's value, a device); exit status 2."""

    status = 2


class Interrupted(Failure):
    """SIGINT or SIGTERM stopped a command; the message says what was saved and how to go on. Exit 128 + signum."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.status = 128 + signum


class ArgumentParser(argparse.ArgumentParser):
    """The parser of every command but train.py (whose options are machinery/options.py's): a bad argument is a
    BadOption, one line through the front door, saying where the options are listed, without argparse's usage
    block before it."""

    def error(self, message: str) -> NoReturn:
        raise BadOption(f"{message} (--help lists the options)")


def quiet_until_started(name: str) -> None:
    """Called at the top of a command, before torch loads: Ctrl-C while it loads ends the process at once, quietly
    (SIGINT's default action, exit 130), where Python would print a traceback from inside torch's import.
    run_command makes it KeyboardInterrupt again. `name` is the caller's __name__: imported, nothing changes."""
    if name == "__main__":
        signal.signal(signal.SIGINT, signal.SIG_DFL)


def first_line(e: BaseException) -> str:
    """The first line of an error's message; of torch's weights-only refusal, only its reason (its first line
    suggests loading with weights_only=False, which would run whatever code the file holds)."""
    text = str(e)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1].strip()
    return text.splitlines()[0] if text else type(e).__name__


def fault_message(e: BaseException, lower: str) -> str | None:
    """One line for a fault of the machine, not of an input: memory that cannot be allocated (what to `lower`), an
    OS error on a file or the console (no space, permission, a name too long); None for the rest."""
    text = str(e)
    if isinstance(e, MemoryError) or (
        isinstance(e, RuntimeError)
        and any(
            why in text for why in ("out of memory", "can't allocate memory", "Storage size calculation overflowed")
        )
    ):
        size = re.search(r"allocate (\d[\d.]* ?(?:bytes|[KMGTP]i?B))", text)  # CPU's and CUDA's allocator
        asked = f" (an allocation of {size.group(1)} failed)" if size else ""
        return f"out of memory{asked}: lower {lower}"
    if isinstance(e, OSError) and e.errno == errno.EFBIG:  # not a full disk: RLIMIT_FSIZE, or the filesystem's own
        where = f" {e.filename}" if e.filename else " a file"
        return f"cannot write{where}: larger than the file size limit (`ulimit -f`, or the filesystem's): raise it"
    if isinstance(e, OSError):
        where = f" on {e.filename}" if e.filename else ""
        return f"{e.strerror or type(e).__name__}{where}: free space, fix the permissions or give another path"
    return None


def say(message: str, every_rank: bool = False) -> None:
    """One line on stderr; under torchrun from rank 0 only (the other processes would say the same), unless RANK is
    not one of the run's ranks (then the line may be about that), or every_rank (a fault of this process's machine:
    said by each that meets it, after its rank)."""
    rank, world = os.environ.get("RANK", "0"), os.environ.get("WORLD_SIZE", "1")
    other = rank.isdecimal() and world.isdecimal() and 0 < int(rank) < int(world)
    if not other or every_rank:
        print(f"rank {rank}: {message}" if other else message, file=sys.stderr, flush=True)


def run_command(
    main: Callable[[], object], lower: str = "the sizes asked for", interrupted: str = "interrupted"
) -> int:
    """Run a command's main() and return its exit status (`sys.exit(run_command(main))`): main's own if it returns an
    int, else 0. A Failure is its one line ("error: ..."; an Interrupted says what was saved) and its status; Ctrl-C
    130, saying `interrupted`; a closed stdout (`| head`) 1, quietly; a fault of the machine (fault_message, with
    what to `lower`) one line and 1. Any other error is a bug, and keeps its traceback."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (Ctrl-C is KeyboardInterrupt again)
    if sys.stdout is not None and hasattr(sys.stdout, "reconfigure"):  # a console that cannot show a character
        sys.stdout.reconfigure(errors="backslashreplace")  # prints its escape
    try:
        status = main()
    except Failure as e:
        say(str(e) if isinstance(e, Interrupted) else f"error: {e}")
        return e.status
    except KeyboardInterrupt:
        say(f"\n{interrupted}")
        return 130
    except BrokenPipeError:  # nothing more to say to stdout; its closing at exit must not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (OSError, MemoryError, RuntimeError) as e:  # stdout on a full disk, an allocation that failed
        if (message := fault_message(e, lower)) is None:
            raise
        say(f"error: {message}", every_rank=True)
        return 1
    return status if isinstance(status, int) else 0
