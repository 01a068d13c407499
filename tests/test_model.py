"""The GPT itself: shapes, loss, causal masking, learning, weight tying, optimizer groups, pluggable norms."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import model as model_module
from helpers import TINY, TRITON_SKIP, norm_params, randomize_norms, tiny_model
from layernorm import LAYERNORMS, NORMS, make_norm
from model import GPT, GPTConfig


@pytest.mark.parametrize("norm", norm_params(NORMS))
def test_every_norm_gives_logits_and_loss_and_refuses_an_input_longer_than_block_size(norm: str) -> None:
    m = tiny_model(norm)
    idx = torch.randint(TINY.vocab_size, (3, 7))
    targets = torch.randint(TINY.vocab_size, (3, 7))
    targets[0, :2] = -1  # ignored positions
    logits, loss = m(idx, targets)
    ref = F.cross_entropy(logits.double().view(-1, TINY.vocab_size), targets.view(-1), ignore_index=-1)
    assert loss.shape == () and abs(loss.item() - ref.item()) < 1e-5
    # at init the predictions are near uniform: loss close to ln(vocab)
    assert abs(loss.item() - math.log(TINY.vocab_size)) < 0.5
    with pytest.raises(ValueError, match="block_size"):
        m(torch.zeros(1, TINY.block_size + 1, dtype=torch.long))


def test_init_is_gpt2s() -> None:
    """GPT-2's init, as nanoGPT's: Linear weights and embeddings N(0, 0.02), the projections into the residual
    stream N(0, 0.02 / sqrt(2 n_layer)), biases 0, the norms weight 1 and bias 0."""
    m = tiny_model(n_layer=4, n_embd=128, block_size=64, vocab_size=65)  # wider than TINY: enough weights for a std
    for name, p in m.named_parameters():
        if name.endswith("c_proj.weight"):
            assert p.std().item() == pytest.approx(0.02 / math.sqrt(2 * m.config.n_layer), rel=0.05), name
        elif name.endswith("weight") and p.dim() == 2:  # the other Linears, the embeddings (wte is the head)
            assert p.std().item() == pytest.approx(0.02, rel=0.05), name
        else:  # biases and the norms' parameters
            assert torch.equal(p, torch.ones_like(p) if name.endswith("weight") else torch.zeros_like(p)), name


def test_weight_tying() -> None:
    m = tiny_model("custom")
    assert m.lm_head.weight is m.transformer.wte.weight


@pytest.mark.parametrize("norm", ["custom", "rmsnorm", "batchnorm"])
def test_no_weight_decay_on_norms_biases_embeddings_and_embed_scale(norm: str) -> None:
    m = tiny_model(norm, embed_scale=True)
    opt = m.configure_optimizers(weight_decay=0.1, learning_rate=1e-3, betas=(0.9, 0.95), device_type="cpu")
    decay_of = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    params = dict(m.named_parameters())  # tied weights once
    assert len(decay_of) == sum(len(g["params"]) for g in opt.param_groups) == len(params)  # each param once
    for name, p in params.items():
        linear_weight = name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))
        assert decay_of[id(p)] == (0.1 if linear_weight else 0.0), name  # the norms' and embed_scale among the 0.0s


def test_model_delegates_every_norm_to_make_norm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever make_norm returns is what the model uses, in all three places, and nothing else normalizes. (Where
    the model says a Linear alone reads a norm, pre-norm's every norm: the Triton norm's output dtype shows it, in
    test_every_layernorm_gives_each_place_the_same_dtype_under_autocast.)"""
    built: list[nn.Module] = []

    def fake_make_norm(name: str, dim: int, *, bias: bool = True, eps: float = 1e-5, **kw: bool) -> nn.Module:
        assert name == "some-future-norm" and dim == TINY.n_embd
        built.append(nn.Identity())
        return built[-1]

    monkeypatch.setattr(model_module, "make_norm", fake_make_norm)
    m = GPT(replace(TINY, norm="some-future-norm"))
    assert len(built) == 2 * TINY.n_layer + 1
    used = [b.ln_1 for b in m.transformer.h] + [b.ln_2 for b in m.transformer.h] + [m.transformer.ln_f]
    assert {id(x) for x in used} == {id(x) for x in built}
    assert not [x for x in m.modules() if "norm" in type(x).__name__.lower()]
    assert m(torch.zeros(1, 3, dtype=torch.long))[0].shape == (1, 3, TINY.vocab_size)


def output_dtypes(m: GPT, idx: torch.Tensor) -> dict[str, torch.dtype]:
    """The dtype each module of m returns (by name) on idx under bfloat16 autocast on the CPU."""
    dtypes: dict[str, torch.dtype] = {}
    for name, module in m.named_modules():
        if name:  # (the GPT itself returns a tuple)
            module.register_forward_hook(lambda mod, args, out, name=name: dtypes.__setitem__(name, out.dtype))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        m(idx)
    return dtypes


@pytest.mark.parametrize("position", ["pre", "post"])
def test_every_layernorm_gives_each_place_the_same_dtype_under_autocast(position: str) -> None:
    """Under bfloat16 autocast every module of the model returns the same dtype whichever LayerNorm it has: the
    residual stream stays float32, a post-norm block's norms (which write it) included. Only where the model says
    a Linear alone reads a norm (pre-norm ln_1, ln_2, ln_f) does the Triton norm write bfloat16, the cast that
    Linear makes; the other two leave the cast to it."""
    idx = torch.randint(TINY.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    norms = [n for n in LAYERNORMS if n != "triton" or TRITON_SKIP is None]
    seen = {norm: output_dtypes(tiny_model(norm, norm_position=position), idx) for norm in norms}
    places = seen["custom"]
    assert [places[f"transformer.h.{i}"] for i in range(TINY.n_layer)] == [torch.float32] * TINY.n_layer
    fed = {p for p in places if position == "pre" and p.endswith(("ln_1", "ln_2", "ln_f"))}
    assert len(fed) == (2 * TINY.n_layer + 1 if position == "pre" else 0)
    for norm, dtypes in seen.items():
        assert dtypes.keys() == places.keys(), norm
        for place, dtype in dtypes.items():
            expected = torch.bfloat16 if norm == "triton" and place in fed else places[place]
            assert dtype == expected, (norm, place, dtype)


# ---- norm_position: "pre" is today's model, "post" normalizes after each residual add ----


def test_post_norm_has_no_final_norm_and_normalizes_after_each_residual_add() -> None:
    """Post-norm's state dict is pre-norm's less ln_f, which is the identity: the last block ends in a norm. Each
    block computes x = ln_1(x + attn(x)); x = ln_2(x + mlp(x)), written out against the block."""
    m = randomize_norms(tiny_model("custom", norm_position="post"))
    assert isinstance(m.transformer.ln_f, nn.Identity)
    pre_keys = set(tiny_model("custom").state_dict())
    assert set(m.state_dict()) == {k for k in pre_keys if not k.startswith("transformer.ln_f")}
    block = m.transformer.h[0]
    x = torch.randn(2, 5, TINY.n_embd, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        h = block.ln_1(x + block.attn(x))
        expected = block.ln_2(h + block.mlp(h))
        torch.testing.assert_close(block(x), expected, rtol=0, atol=0)


def test_bad_norm_position_is_an_error() -> None:  # (as an option: test_train.py)
    with pytest.raises(ValueError, match="norm_position must be 'pre' or 'post', got 'mid'"):
        GPTConfig(norm_position="mid")


# ---- embed_scale and norm_alpha: DyT's recipe (layernorm.DyT), model options any norm can run with ----


def test_embed_scale_off_is_todays_model_and_on_scales_the_embeddings() -> None:
    """Off (the default): no new parameter (today's model, whose greedy text is nanoGPT's: test_nanogpt.py). On: one
    learned scalar from sqrt(n_embd) times the embeddings that enter the first block, the rest of the model (same
    seed) unchanged; it learns."""
    idx = torch.randint(TINY.vocab_size, (2, TINY.block_size), generator=torch.Generator().manual_seed(0))
    off, on = tiny_model("rmsnorm"), tiny_model("rmsnorm", embed_scale=True)
    assert off.embed_scale is None and set(on.state_dict()) - set(off.state_dict()) == {"embed_scale"}
    assert on.embed_scale.item() == pytest.approx(math.sqrt(TINY.n_embd))
    assert all(torch.equal(p, on.state_dict()[k]) for k, p in off.state_dict().items())
    into_first_block = []
    on.transformer.h[0].register_forward_pre_hook(lambda block, args: into_first_block.append(args[0]))
    on.train()
    on(idx, idx)[1].backward()
    t = on.transformer
    torch.testing.assert_close(into_first_block[0], (t.wte(idx) + t.wpe(torch.arange(idx.size(1)))) * on.embed_scale)
    assert on.embed_scale.grad is not None and on.embed_scale.grad.abs() > 0


def test_norm_alpha_reaches_every_dyt_and_is_refused_elsewhere() -> None:
    m = tiny_model("dyt", norm_alpha=0.5)
    alphas = [mod.alpha.item() for mod in m.modules() if hasattr(mod, "alpha")]
    assert alphas == [0.5] * (2 * TINY.n_layer + 1)
    assert tiny_model("dyt").transformer.ln_f.alpha.item() == make_norm("dyt", TINY.n_embd).alpha.item()  # its recipe
    with pytest.raises(ValueError, match="alpha"):  # refused by make_norm (test_layernorm.py), when configured
        GPTConfig(norm="custom", norm_alpha=0.5)


@pytest.mark.parametrize(
    ("trained", "asked"), [("builtin", "rmsnorm"), ("rmsnorm", "custom"), ("batchnorm", "builtin"), ("dyt", "rmsnorm")]
)
def test_from_checkpoint_refuses_a_norm_that_computes_another_function(trained: str, asked: str) -> None:
    """The LayerNorms swap for one another (tests/test_nanogpt.py samples with each); a contrast never swaps, in
    either direction."""
    m = tiny_model(trained)
    checkpoint = {"model_args": vars(m.config), "model": m.state_dict()}
    with pytest.raises(ValueError, match=f"trained with norm='{trained}'.* but not with '{asked}'"):
        GPT.from_checkpoint(checkpoint, norm=asked)
