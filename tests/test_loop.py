"""train.py's loop: the learning-rate schedule at its landmarks, and the loop's arithmetic (gradient accumulation
over micro-steps, gradient clipping, the logged loss, the evaluation's average) against a few lines of reference
loop on a tiny model, iteration by iteration."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import train
from helpers import TEXT, TINY, VOCAB, make_dataset, tiny_args, tiny_model
from machinery.dataset import PreparedData
from machinery.options import TrainConfig, build_config, parse_args
from machinery.runlog import read_metrics
from machinery.step import get_lr, train_step
from model import GPT

# ---- the schedule ----

SCHEDULES = {
    "defaults": {},
    "short": {"learning_rate": 6e-4, "warmup_iters": 10, "lr_decay_iters": 50, "min_lr": 6e-5},
    "no warmup": {"learning_rate": 1e-3, "warmup_iters": 0, "lr_decay_iters": 40, "min_lr": 0.0},
}


@pytest.mark.parametrize("name", SCHEDULES)
def test_get_lr_landmarks(name):
    """nanoGPT's schedule, point by point: warmup from the first iteration (never 0), the peak where the warmup
    ends, the mean of peak and floor halfway through the cosine and (2 + sqrt 2) / 4 of the way down from the floor
    a quarter through it (a straight line would give 3/4), min_lr from lr_decay_iters on; with decay_lr=False,
    learning_rate throughout."""
    cfg = build_config(SCHEDULES[name])
    peak = cfg.learning_rate
    floor = cfg.min_lr
    w = cfg.warmup_iters
    d = cfg.lr_decay_iters
    lr = [get_lr(it, cfg) for it in range(d + 3)]
    if w:
        assert lr[0] == pytest.approx(peak / (w + 1)) and lr[w - 1] == pytest.approx(peak * w / (w + 1))
        assert all(a < b for a, b in zip(lr[:w], lr[1 : w + 1], strict=True))  # rising through the warmup
    assert lr[w] == pytest.approx(peak)
    if (d - w) % 2 == 0:
        assert lr[(w + d) // 2] == pytest.approx((peak + floor) / 2)
    if (d - w) % 4 == 0:
        assert lr[w + (d - w) // 4] == pytest.approx(floor + (peak - floor) * (2 + math.sqrt(2)) / 4)
    assert all(a > b for a, b in zip(lr[w:d], lr[w + 1 : d + 1], strict=True))  # falling through the cosine
    assert lr[d:] == pytest.approx([floor] * 3)
    constant = build_config({**SCHEDULES[name], "decay_lr": False})
    assert {get_lr(it, constant) for it in range(d + 3)} == {peak}


# ---- the loop ----

CLIP = 1.1  # the tiny model's first gradients have norms about 1.0 to 1.25: it binds at some iterations, not all
LOOP_FLAGS = [
    "--max_iters=6",
    "--eval_interval=1",
    "--eval_iters=3",
    "--gradient_accumulation_steps=2",
    "--always_save_checkpoint=False",
    "--bias=False",  # no attention key bias: its gradient is exactly 0 in theory, rounding noise in practice
]


def run_recorded(argv: list[str]) -> dict:
    """train.main(argv) in this process, with what the optimizer sees at every step recorded through torch's
    optimizer step hooks: the gradients (after clipping) and the parameters after the step."""
    seen = {"grads": [], "params": []}
    real_setup = train.setup

    def recording_setup(*args, **kwargs):
        run = real_setup(*args, **kwargs)
        model = run.model
        seen["config"] = model.config
        seen["init"] = copy.deepcopy(model.state_dict())

        def before_step(opt, _args, _kwargs):
            seen["grads"].append({n: p.grad.detach().clone() for n, p in model.named_parameters()})

        def after_step(_opt, _args, _kwargs):
            seen["params"].append({n: p.detach().clone() for n, p in model.named_parameters()})

        run.optimizer.register_step_pre_hook(before_step)
        run.optimizer.register_step_post_hook(after_step)
        return run

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(train, "setup", recording_setup)
        seen["summary"] = train.main(argv)
    return seen


@torch.no_grad()
def reference_eval(model: GPT, windows: PreparedData, cfg: TrainConfig) -> dict[str, float]:
    """The mean of eval_iters batch losses per split, drawn as estimate_loss documents: a generator of its own."""
    gen = torch.Generator().manual_seed(cfg.seed + train.EVAL_SEED_OFFSET)
    model.eval()
    out = {}
    for split in ("train", "val"):
        starts = torch.randint(windows.num_starts(split), (cfg.eval_iters, cfg.batch_size), generator=gen)
        losses = [model(*windows.get(split, rows, "cpu"))[1].item() for rows in starts]
        out[split] = math.fsum(losses) / len(losses)
    model.train()
    return out


def reference_loop(seen: dict, windows: PreparedData, cfg: TrainConfig) -> dict:
    """nanoGPT's loop from the loop's initial weights, on the same batches, in the loop's float32 and its order of
    operations (so that it agrees with the loop to the bit: Adam turns any rounding difference in a near-zero
    gradient into a difference of a whole step). Per iteration: the learning rate, the gradient's norm before
    clipping (in float64), the gradient after it, the parameters after the step, the mean micro-batch loss, and
    the evaluations before the step."""
    model = GPT(seen["config"])
    model.load_state_dict(seen["init"])
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), "cpu")
    data_gen = torch.Generator().manual_seed(cfg.seed)  # the data stream's generator, as train.setup seeds it
    torch.manual_seed(cfg.seed)  # dropout's masks: the global generator, as train.setup seeds it (one process)
    steps = cfg.gradient_accumulation_steps
    ref = {"lr": [], "grads": [], "params": [], "loss": [], "norm": [], "evals": []}
    for it in range(cfg.max_iters + 1):
        ref["evals"].append(reference_eval(model, windows, cfg))
        if it == cfg.max_iters:
            break
        lr = get_lr(it, cfg)  # the schedule itself: test_get_lr_landmarks
        for group in optimizer.param_groups:
            group["lr"] = lr
        starts = torch.randint(windows.num_starts("train"), (steps, cfg.batch_size), generator=data_gen)
        losses = []
        for rows in starts:
            _, loss = model(*windows.get("train", rows, "cpu"))
            (loss / steps).backward()  # the gradient of the mean over the micro-batches
            losses.append(loss.item())
        ref["norm"].append(math.sqrt(math.fsum(p.grad.double().pow(2).sum().item() for p in model.parameters())))
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        ref["lr"].append(lr)
        ref["grads"].append({n: p.grad.clone() for n, p in model.named_parameters()})
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ref["params"].append({n: p.detach().clone() for n, p in model.named_parameters()})
        ref["loss"].append(math.fsum(losses) / steps)
    return ref


@pytest.fixture(scope="module", params=[(0.0, 0.0), (CLIP, 0.1)], ids=["no clip", f"clip {CLIP}, dropout 0.1"])
def loop_and_reference(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("loop")
    # TEXT repeats with a period that divides the split point, so its val windows are train windows; three more
    # characters shift the split, and an eval that read train batches for val would no longer match
    data = make_dataset(tmp / "data", text=TEXT + "the")
    clip, dropout = request.param
    argv = tiny_args(data, tmp / "out", *LOOP_FLAGS, f"--grad_clip={clip}", f"--dropout={dropout}")
    seen = run_recorded(argv)
    cfg = build_config(parse_args(argv))
    ref = reference_loop(seen, PreparedData(str(data), "tiny", cfg.block_size), cfg)  # its windows: test_data.py
    return seen, ref, read_metrics(tmp / "out" / "metrics.jsonl"), cfg


# The reference does the loop's float32 operations in the loop's order: today they agree to the bit. The float32
# tolerances admit a reordering of a sum (a relative 1e-7) over these few steps, no more. The losses are means that
# the reference sums exactly (math.fsum) and the loop in float32.
GRAD_TOL = {"rtol": 1e-5, "atol": 1e-8}
PARAM_TOL = {"rtol": 1e-5, "atol": 1e-7}
LOSS_REL = 1e-6


def test_every_step_matches_the_reference_loop(loop_and_reference):
    """Iteration by iteration: the gradient the optimizer is handed (accumulated over the micro-steps, then clipped)
    and the parameters after the step, which the learning rate the loop set makes. With CLIP the clip binds at some
    iterations, not all: a gradient clipped where it should not be, or not where it should, differs from the
    reference's; and dropout draws the reference's masks only if the loop seeds them as the reference does."""
    seen, ref, _, cfg = loop_and_reference
    assert len(seen["grads"]) == len(ref["grads"]) == cfg.max_iters
    if cfg.grad_clip:
        assert min(ref["norm"]) < cfg.grad_clip < max(ref["norm"]), (ref["norm"], "choose CLIP between the norms")
    for it in range(cfg.max_iters):
        for name, grad in seen["grads"][it].items():
            torch.testing.assert_close(grad, ref["grads"][it][name], **GRAD_TOL, msg=f"iteration {it}: grad of {name}")
        for name, param in seen["params"][it].items():
            torch.testing.assert_close(param, ref["params"][it][name], **PARAM_TOL, msg=f"iteration {it}: {name}")


def test_logged_losses_match_the_reference_loop(loop_and_reference):
    """metrics.jsonl: each iteration's loss is the mean over its micro-batches; each evaluation is the mean of
    eval_iters batch losses per split, at every iteration and at the end."""
    _, ref, metrics, cfg = loop_and_reference
    trains = [r for r in metrics if r["kind"] == "train"]
    evals = [r for r in metrics if r["kind"] == "eval"]
    assert [r["iter"] for r in trains] == list(range(cfg.max_iters))
    assert [r["iter"] for r in evals] == list(range(cfg.max_iters + 1))
    assert [r["loss"] for r in trains] == pytest.approx(ref["loss"], rel=LOSS_REL)
    assert [r["lr"] for r in trains] == pytest.approx(ref["lr"], rel=1e-12)
    for r, expected in zip(evals, ref["evals"], strict=True):
        assert (r["train_loss"], r["val_loss"]) == pytest.approx((expected["train"], expected["val"]), rel=LOSS_REL)


def test_a_loss_scale_changes_nothing_but_the_scale() -> None:
    """float16's GradScaler multiplies the loss by a power of two and divides the gradients back before the clip and
    the step. With the clip binding, a step with a scaler is the step without one, to the bit: a clip of the scaled
    gradients would shrink this step by the scale."""
    model = tiny_model()
    xs = torch.randint(VOCAB, (1, 4, TINY.block_size))  # [micro_steps, B, T]
    ys = torch.randint(VOCAB, (1, 4, TINY.block_size))
    after = []
    for scaler in (None, torch.amp.GradScaler("cpu", init_scale=2.0**12)):
        m = copy.deepcopy(model)
        train_step(m, torch.optim.SGD(m.parameters(), lr=1.0), xs, ys, grad_clip=1e-3, scaler=scaler)
        after.append(m.state_dict())
    assert all(torch.equal(after[0][k], after[1][k]) for k in after[0])
    assert not torch.equal(after[0]["lm_head.weight"], model.state_dict()["lm_head.weight"])  # it stepped
