"""Every command the README and docs/ print runs as printed, from a fresh copy of the repository, in the README's
order and then the chapters', with only flags that make it small appended (a later --key=value wins); at the end
the Quickstart's checkpoint is still the one it trained. Each runs in a process of its own, forked from one that
imported torch once (tests/one_process.py). A nanoGPT checkpoint sits where the README's "Your nanoGPT checkpoint"
commands read it, beside the copy. Commands that run for minutes are named in LONG, each with the test that runs
its plumbing at a tiny size instead, so a new command that is neither fails here. Every file and picture the docs
link to or cite exists. (The docs' Python blocks run in test_docs.py.)"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import (
    CHARS,
    DOCS,
    ROOT,
    TINY_TRAIN,
    TRITON_SKIP,
    nanogpt_model,
    save_nanogpt_checkpoint,
    subprocess_env,
    write_meta,
)

# DOCS lists the README first, then the chapters in reading order: the order their commands run in.
TEXT = {doc: doc.read_text(encoding="utf-8") for doc in DOCS}
README = TEXT[ROOT / "README.md"]
QUICKSTART_CKPT = Path("out-shakespeare-char-cpu") / "ckpt.pt"
# train.py: the tests' tiny run for two iterations, at batch 2 and one eval batch (the --norm=triton run, through
# Triton's interpreter, takes 9 s so, 16 s at TINY_TRAIN's 4 and 2), its sample at the end kept short.
SIZE_FLAGS = {
    "train.py": [
        *TINY_TRAIN,
        *"--max_iters=2 --eval_interval=2 --batch_size=2 --eval_iters=1".split(),
        *"--sample_at_end=True --sample_tokens=5".split(),
    ],
    "sample.py": ["--max_new_tokens=5", "--device=cpu"],
    "batch_independence.py": ["--prompt_len=2", "--new_tokens=2", "--device=cpu"],
    "bench.decoding": ["--prompt_len=4", "--new_tokens=4", "--repeats=1", "--batches=1", "--device=cpu"],
}
# Commands that run for minutes (or need a GPU), and the test that runs their plumbing at a tiny size.
LONG = {
    "python -m pytest -n auto": "this suite itself",
    'python -m pytest -m "not slow" -n auto': "this suite itself",
    # GPT-2's weights are downloaded: tests/test_gpt2.py runs these on small random GPT-2s saved by transformers
    'python sample.py --init_from=gpt2 --norm=custom --temperature=0 --start="To be, or not to be"': "test_gpt2.py",
    "python batch_independence.py --init_from=gpt2 --norms=custom,builtin": "test_gpt2.py",
    "python train.py configs/finetune_shakespeare.json": "test_gpt2.py",
    "python export_gpt2.py --out_dir=out-finetune-shakespeare --to=gpt2-shakespeare": "test_gpt2.py",
    # out-ln-free is what experiments/remove_layernorm.py leaves: test_remove_layernorm.py runs both on its smoke run's
    'python sample.py --out_dir=out-ln-free --start="ROMEO:" --max_new_tokens=200': "test_remove_layernorm.py",
    "python batch_independence.py --out_dir=out-ln-free --norms=frozen": "test_remove_layernorm.py",
}


# bench/ commands that take seconds: run here as printed, not only by their plumbing tests.
QUICK_BENCH = ("python -m bench.plot_batch_independence", "python -m bench.decoding --ckpt ../nanoGPT/")
# Files the Quickstart makes, which a doc may name before they exist.
MADE_BY_THE_QUICKSTART = ("data/shakespeare_char/input.txt",)


def commands_in(text: str) -> list[str]:
    """The commands in a doc's code blocks and inline code, in the order they appear."""
    found = []
    for block, inline in re.findall(r"```\w*\n(.*?)```|`([^`\n]+)`", text, re.S):
        for line in block.splitlines() if block else [inline]:
            line = line.split("  # ")[0].strip()  # a comment after the command
            if re.match(r"(TRITON_INTERPRET=1 )?(python3?|torchrun|bash) ", line) and "<" not in line:
                found.append(line)
    return found


def readme_commands() -> list[str]:
    """The README's commands, then each chapter's, in reading order, each once."""
    return list(dict.fromkeys(c for doc in DOCS for c in commands_in(TEXT[doc])))


def split_env(command: str) -> tuple[dict[str, str], list[str]]:
    """A command's environment prefix (`TRITON_INTERPRET=1 python ...`) and its words after it."""
    words = shlex.split(command)
    env = {}
    while re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words


def script_of(command: str) -> str:
    words = split_env(command)[1]
    words = words[words.index("train.py") :] if "torchrun" in words else words[1:]
    return words[0] if words[0] != "-m" else words[1]


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory, shakespeare_path: Path) -> Path:
    """The repository's files as a fresh clone has them, Tiny Shakespeare where the README says to put it, and a
    nanoGPT checkpoint where the README's commands for one read it: nanoGPT's folder beside the clone."""
    out = tmp_path_factory.mktemp("docs") / "clone"
    ls_files = ["git", "ls-files", "--cached", "--others", "--exclude-standard"]
    for name in subprocess.check_output(ls_files, cwd=ROOT, text=True).split():
        if (ROOT / name).is_file():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, out / name)
    for where in ("data/shakespeare_char/input.txt", "data/shakespeare/input.txt", "my.txt"):
        shutil.copy(shakespeare_path, out / where)
    nanogpt = out.parent / "nanoGPT"
    save_nanogpt_checkpoint(nanogpt / "out-shakespeare-char", nanogpt_model(len(CHARS), bias=False))
    write_meta(nanogpt / "data" / "shakespeare_char" / "meta.pkl")
    return out


def argv_of(command: str) -> list[str]:
    """What follows `python` in a command (for torchrun, `-m torch.distributed.run`), with its size flags."""
    words = split_env(command)[1]
    words[:1] = ["-m", "torch.distributed.run"] if words[0] == "torchrun" else []
    return words + SIZE_FLAGS.get(script_of(command), [])


def run_each(commands: list[str], cwd: Path, scratch: Path) -> list[dict]:
    """The commands one after another from `cwd`, each in a process forked from one that imported torch once
    (tests/one_process.py), with its environment prefix (`TRITON_INTERPRET=1 python ...`) set. For each: its exit
    status ("code"), its "stderr", and the sha256 of the Quickstart's checkpoint after it ("watch", None before)."""
    spec = {"commands": [{"argv": argv_of(c), "env": split_env(c)[0]} for c in commands], "watch": str(QUICKSTART_CKPT)}
    done = scratch / "results.jsonl"
    runner = [sys.executable, str(ROOT / "tests" / "one_process.py"), json.dumps(spec), str(done)]
    try:
        proc = subprocess.run(runner, cwd=cwd, env=subprocess_env(), capture_output=True, text=True, timeout=1800)
        stopped = f"the process running it stopped (exit {proc.returncode}): {proc.stderr.strip()[-600:]}"
    except subprocess.TimeoutExpired:
        stopped = "the process running it timed out"
    lines = done.read_text(encoding="utf-8").splitlines() if done.exists() else []
    assert len(lines) == len(commands), f"{commands[len(lines)]}\n  never finished: {stopped}"
    return [json.loads(line) for line in lines]


def test_the_quickstart_and_test_commands_are_what_ci_runs() -> None:
    quickstart = re.findall(r"```\n(.*?)```", README.split("## Quickstart")[1], re.S)[0].splitlines()
    assert quickstart == [
        "python3 -m venv .venv && . .venv/bin/activate",
        "pip install -r requirements.txt",
        "python data/shakespeare_char/prepare.py",
        "python train.py configs/shakespeare_char_cpu.json",
    ]
    (tests,) = [c for c in readme_commands() if c.startswith("python3 -m venv") and "pytest" in c]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = tests.split(" && ")[-1]
    assert command.startswith("python -m pytest") and command.replace("python -m pytest", "python -m pytest -q") in ci
    for requirements in re.findall(r"-r (\S+)", tests):
        assert (ROOT / requirements).is_file() and requirements in ci
    # The CPU-only PyTorch the README offers is the version requirements.txt pins.
    (pin,) = re.findall(r"^torch==(\S+)$", (ROOT / "requirements.txt").read_text(encoding="utf-8"), re.M)
    assert f"`pip install torch=={pin} --index-url https://download.pytorch.org/whl/cpu`" in README


def as_documented(command: str, result: dict) -> bool:
    """Ran cleanly; or, where triton cannot be imported (macOS, Windows), a --norm=triton command refused in the
    one line the docs show for it."""
    clean = "Traceback" not in result["stderr"]
    if TRITON_SKIP is not None and "--norm=triton" in command:
        return result["code"] == 2 and "needs the triton package" in result["stderr"] and clean
    return result["code"] == 0 and clean


@pytest.mark.slow  # every command the docs print, the Quickstart's training run first
def test_every_doc_command_runs_as_printed(clone: Path, tmp_path: Path) -> None:
    # The Quickstart's own steps first (prepare, then train): the later commands read what they leave.
    commands = ["python data/shakespeare_char/prepare.py", "python train.py configs/shakespeare_char_cpu.json"]
    commands += [c for c in readme_commands() if not c.startswith("python3 -m venv")]
    ran = []
    for command in dict.fromkeys(commands):
        # exercises/ grades the learner's files, which start as stubs (exit 1): test_exercises.py runs it
        long = command in LONG or script_of(command).startswith(("bench", "experiments", "exercises"))
        if long and not command.startswith(QUICK_BENCH):
            continue  # LONG, bench/ and experiments/: test_bench.py, test_gpu_sh.py, test_experiments.py
        ran.append(command)
    results = run_each(ran, clone, tmp_path)
    failed = [
        f"{c}\n  exit {r['code']}: {r['stderr'].strip()[-600:]}"
        for c, r in zip(ran, results, strict=True)
        if not as_documented(c, r)
    ]
    assert not failed, "\n".join(failed)
    assert len(ran) >= 15 and any(c.startswith("torchrun") for c in ran) and any("sample.py" in c for c in ran)
    assert any("../nanoGPT/" in c for c in ran)
    # No later command replaced the Quickstart's checkpoint (each run has a folder of its own).
    quickstart = next(r["watch"] for r in results if r["watch"] is not None)
    assert results[-1]["watch"] == quickstart


def test_long_commands_are_still_in_the_docs() -> None:
    assert set(LONG) <= set(readme_commands())


def slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.*)$", doc.read_text(encoding="utf-8"), re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_every_link_and_cited_file_exists(doc: Path) -> None:
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", TEXT[doc]):  # Markdown links and pictures
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in anchors(linked)):
            missing.append(target)
    for cited in re.findall(r"`((?:bench|exercises|experiments|tests|configs|docs|data)/[\w./*-]+)`", TEXT[doc]):
        if cited not in MADE_BY_THE_QUICKSTART and not list(ROOT.glob(cited.rstrip("/"))):
            missing.append(cited)
    assert not missing, f"{doc.name} links to or cites what does not exist: {missing}"
