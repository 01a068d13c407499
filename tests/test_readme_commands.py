"""Every command the README prints runs as printed, from a fresh copy of the repository, with only flags that
make it small appended (a later --key=value wins). Commands that run for minutes are named in LONG, each with the
test that runs its plumbing at a tiny size instead, so a new README command that is neither fails here."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, subprocess_env

README = (ROOT / "README.md").read_text(encoding="utf-8")
# A small model and a short run: what every train.py command of the README gets appended.
TINY_TRAIN = [
    "--n_layer=1",
    "--n_head=2",
    "--n_embd=16",
    "--block_size=16",
    "--batch_size=2",
    "--max_iters=2",
    "--eval_iters=1",
    "--eval_interval=2",
    "--warmup_iters=0",
    "--lr_decay_iters=2",
    "--sample_tokens=5",
    "--device=cpu",
    "--dropout=0.0",
]
TINY = {
    "train.py": TINY_TRAIN,
    "sample.py": ["--max_new_tokens=5", "--device=cpu"],
    "batch_independence.py": ["--prompt_len=2", "--new_tokens=2", "--device=cpu"],
}
# Commands that run for minutes (or need a GPU), and the test that runs their plumbing at a tiny size.
LONG = {
    "python -m pytest": "this suite itself",
}


def readme_commands() -> list[str]:
    """The commands in the README's code blocks and inline code, in the order they appear."""
    found = []
    for block, inline in re.findall(r"```\w*\n(.*?)```|`([^`\n]+)`", README, re.S):
        for line in block.splitlines() if block else [inline]:
            line = line.split("  # ")[0].strip()  # a comment after the command
            if re.match(r"(TRITON_INTERPRET=1 )?(python3?|torchrun|bash) ", line) and "<" not in line:
                found.append(line)
    return list(dict.fromkeys(found))


def script_of(command: str) -> str:
    words = shlex.split(command)
    words = words[words.index("train.py") :] if "torchrun" in words else words[1:]
    return words[0] if words[0] != "-m" else words[1]


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory, shakespeare_path: Path) -> Path:
    """The repository's files as a fresh clone has them, and Tiny Shakespeare where the README says to put it."""
    out = tmp_path_factory.mktemp("clone")
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, out / name)
    for dataset in ("shakespeare_char", "shakespeare"):
        shutil.copy(shakespeare_path, out / "data" / dataset / "input.txt")
    shutil.copy(shakespeare_path, out / "my.txt")
    return out


def run(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {}
    if command.startswith("TRITON_INTERPRET=1 "):
        command, env = command.removeprefix("TRITON_INTERPRET=1 "), {"TRITON_INTERPRET": "1"}
    words = shlex.split(command)
    if words[0] in ("python", "python3"):
        words[0] = sys.executable
    elif words[0] == "torchrun":
        words[:1] = [sys.executable, "-m", "torch.distributed.run"]
    words += TINY.get(script_of(command), [])
    return subprocess.run(words, cwd=cwd, env=subprocess_env(**env), capture_output=True, text=True, timeout=300)


def test_the_quickstart_and_test_commands_are_what_ci_runs() -> None:
    quickstart, tests = [c for c in readme_commands() if c.startswith("python3 -m venv")]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert tests.endswith("&& python -m pytest") and "python -m pytest" in ci
    for requirements in re.findall(r"-r (\S+)", quickstart + tests):
        assert (ROOT / requirements).is_file() and requirements in ci
    assert quickstart.endswith(
        "&& python data/shakespeare_char/prepare.py && python train.py configs/shakespeare_char_cpu.json"
    )


def test_every_readme_command_runs_as_printed(clone: Path) -> None:
    # The Quickstart's own steps first (prepare, then train): the later commands read what they leave.
    commands = ["python data/shakespeare_char/prepare.py", "python train.py configs/shakespeare_char_cpu.json"]
    commands += [c for c in readme_commands() if not c.startswith("python3 -m venv")]
    ran, failed = [], []
    for command in dict.fromkeys(commands):
        if command in LONG or script_of(command).startswith(("bench", "experiments")):
            continue  # LONG, bench/ and experiments/: test_bench.py, test_gpu_sh.py, test_experiments.py
        proc = run(command, clone)
        ran.append(command)
        if proc.returncode != 0 or "Traceback" in proc.stderr:
            failed.append(f"{command}\n  exit {proc.returncode}: {proc.stderr.strip()[-600:]}")
    assert not failed, "\n".join(failed)
    assert len(ran) >= 15 and any(c.startswith("torchrun") for c in ran) and any("sample.py" in c for c in ran)


def test_long_commands_are_still_in_the_readme() -> None:
    assert set(LONG) <= set(readme_commands())
