"""The training step's optimizer: configure_optimizers picks torch's fused AdamW on a CPU, and a checkpoint saved by
torch's per-parameter loop (as runs saved before it was fused) resumes in it with the loop's own steps."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import torch

from helpers import TINY, tiny_model
from machinery.checkpoint import restore_training_state, rng_state
from machinery.device import Dist
from model import GPT

# float32: the fused kernel and the loop may round an update differently in the last bit (2**-23 relative),
# and over a few steps that stays within a few units of the last place.
RTOL, ATOL = 1e-5, 1e-7


def train(model: GPT, optimizer: torch.optim.Optimizer, steps: int, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randint(TINY.vocab_size, (4, TINY.block_size), generator=gen)
        y = torch.randint(TINY.vocab_size, (4, TINY.block_size), generator=gen)
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def loop_optimizer(model: GPT) -> torch.optim.AdamW:
    """The same groups and hyperparameters as configure_optimizers, updated by torch's per-parameter loop."""
    fused = model.configure_optimizers(0.1, 1e-2, (0.9, 0.99), "cpu")
    groups = [{k: v for k, v in g.items() if k not in ("fused", "foreach")} for g in fused.param_groups]
    return torch.optim.AdamW(groups, fused=False, foreach=False)


def assert_same_parameters(a: GPT, b: GPT) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=RTOL, atol=ATOL, msg=lambda m, name=name: f"{name}: {m}")


def test_fused_adamw_resumes_the_loops_checkpoint_with_its_steps_and_counters():
    """configure_optimizers fuses on a CPU, and a resume keeps it fused (not the saved groups' fused=False); the
    steps after it are the loop's own. torch moves each step counter onto its parameter's device, in float32, only
    where the param group says fused: the loop's counters (float64 here, where it ran under a float64 default
    dtype) become the ones a fused optimizer makes itself."""
    # No biases: the key projection's bias has a gradient of zero in exact arithmetic (softmax ignores a shift shared
    # by every key), so its computed gradient is rounding noise, which Adam scales up to full-size steps.
    model = tiny_model(bias=False)
    loop = loop_optimizer(model)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the loop's counters come in the default dtype
    try:
        train(model, loop, 3)
    finally:
        torch.set_default_dtype(default)
    saved_model = {k: v.clone() for k, v in model.state_dict().items()}
    saved_optimizer = copy.deepcopy(loop.state_dict())  # (its tensors are the live state, updated in place)
    assert {s["step"].dtype for s in saved_optimizer["state"].values()} == {torch.float64}
    train(model, loop, 2, seed=2)  # the loop, uninterrupted

    resumed = tiny_model(bias=False)
    resumed.load_state_dict(saved_model)
    fused = resumed.configure_optimizers(0.1, 1e-2, (0.9, 0.99), "cpu")
    data_gen = torch.Generator()
    ckpt = {"optimizer": saved_optimizer, "rng": rng_state(data_gen), "iter_num": 3, "best_val_loss": 1.0}
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    run = SimpleNamespace(optimizer=fused, scaler=scaler, data_gen=data_gen, dist=Dist(), ckpt_path=Path("ckpt.pt"))
    restore_training_state(ckpt, run)  # train.py's Run, as far as it reads it
    assert all(group["fused"] for group in fused.param_groups)
    assert {(s["step"].dtype, s["step"].device, s["step"].item()) for s in fused.state.values()} == {
        (torch.float32, torch.device("cpu"), 3.0)
    }
    train(resumed, fused, 2, seed=2)
    assert_same_parameters(resumed, model)
    assert {s["step"].item() for s in fused.state.values()} == {5.0}
