"""A GPT in nanoGPT's shape, with a pluggable norm, placed before or after each sublayer, and a KV cache.

Every block is pre-norm (GPT-2, the default) or post-norm (the original Transformer, norm_position="post") over
activations of shape [B, T, C]:

    pre:  x = x + attn(ln_1(x))        post:  x = ln_1(x + attn(x))
          x = x + mlp(ln_2(x))                x = ln_2(x + mlp(x))

and a pre-norm model has a final ln_f before the LM head. Which normalization these layers compute is the one
choice this file leaves open: it asks `layernorm.make_norm(config.norm, ...)` and knows nothing else about norms.

Decoding with a KV cache (`GPT.generate(..., use_kv_cache=True)`, the default): the prompt runs through the model
once (prefill), each layer keeps its keys and values, and every later token runs through the model alone, as
activations of shape [B, 1, C]. That is the same computation as re-running the whole context only because every
norm here takes its statistics from each token's own features (batch_independence.py shows it, and BatchNorm
breaking it).

Past block_size tokens the context must be cut (the model learned positions 0..block_size-1), and a cut moves
every kept token, so cached keys go stale. Without the cache every step sees the last block_size tokens (nanoGPT's
sliding window); with it, a full cache is prefilled afresh from the last block_size // 2 tokens, since sliding by
one would recompute the whole window every step. Each is exact on the context it keeps (tests/test_kv_cache.py,
tests/test_nanogpt.py).

Prompts of different lengths decode in one batch left padded, with an attention mask as transformers takes it
(pad_left makes both): each row's positions count from its own first token and no token sees the padding, so each
row decodes as it would alone (without the cache past block_size too; with it, a padded batch refills its window
when its longest row fills it).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pickle
import re
import textwrap
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch.nn import functional as F

from layernorm import LAYERNORMS, make_norm


@dataclass
class GPTConfig:
    block_size: int = 256
    vocab_size: int = 65
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 384
    dropout: float = 0.0
    bias: bool = True  # bias in the Linear layers and the norms, as in GPT-2; False is a little faster and smaller
    norm: str = "builtin"  # any name in layernorm.NORMS
    norm_position: str = "pre"  # "pre": x + f(ln(x)), as GPT-2; "post": ln(x + f(x)), as the original Transformer
    norm_alpha: float | None = None  # the norm's starting alpha, for a norm that has one (DyT); None: the norm's own
    embed_scale: bool = False  # the embeddings times a learned scalar from sqrt(n_embd), as the DyT paper's LMs
    gelu: str = "none"  # nn.GELU's approximate: "none" (erf, as nanoGPT), or "tanh" (GPT-2's own, HF's "gelu_new")

    def __post_init__(self) -> None:
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}): each head gets "
                f"n_embd // n_head features"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        for name, valid in (("norm_position", ("pre", "post")), ("gelu", ("none", "tanh"))):
            if getattr(self, name) not in valid:
                raise ValueError(f"{name} must be {valid[0]!r} or {valid[1]!r}, got {getattr(self, name)!r}")
        if self.norm_alpha is not None:
            new_norm(self)  # a norm without an alpha, or an alpha <= 0: make_norm's ValueError, before any model

    @classmethod
    def from_options(cls, options: Any, **changes: Any) -> GPTConfig:
        """The model that `options` describe: train.py's TrainConfig, a checkpoint's model_args (a dict), or any
        object with these fields as attributes; the other options are ignored, `changes` win."""
        given = options if isinstance(options, dict) else vars(options)
        return cls(**{**{f.name: given[f.name] for f in fields(cls) if f.name in given}, **changes})


def new_norm(config: GPTConfig, feeds_linear: bool = False) -> nn.Module:
    """One norm layer over n_embd features, as config says; feeds_linear as in make_norm (pre-norm's every norm)."""
    return make_norm(config.norm, config.n_embd, bias=config.bias, alpha=config.norm_alpha, feeds_linear=feeds_linear)


@contextlib.contextmanager
def nothing_drawn() -> Iterator[None]:
    """Within it, modules are built on the meta device: shapes, no memory, no random number drawn, as the weights
    come from a file. nn.init.normal_ leaves tensors as they are: on meta tensors it imports torch's compiler
    (150 MB), where uniform_ and zeros_ do not."""
    normal_ = nn.init.normal_
    nn.init.normal_ = lambda tensor, *args, **kwargs: tensor
    try:
        with torch.device("meta"):
            yield
    finally:
        nn.init.normal_ = normal_


def padding_mask(pad: torch.Tensor, past: int, T: int) -> torch.Tensor:
    """Which keys each of T queries sees after `past` cached ones, [B, 1, T, past + T], for rows whose first pad[b]
    tokens are padding: causal, and none of the padding; a padding query sees itself alone (a row of no keys
    would be NaN)."""
    keys = torch.arange(past + T, device=pad.device)
    queries = keys[past:, None]  # [T, 1]
    seen = (keys <= queries) & (keys >= pad[:, None, None])  # [B, T, past + T]
    return (seen | (keys == queries))[:, None]


def pad_left(prompts: list[list[int]], pad_token: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of different lengths as one batch: their token ids [B, T], each left padded with pad_token to the
    longest, and the attention mask [B, T] (1: a token, 0: padding) that GPT.generate and GPT.stream take."""
    T = max(len(p) for p in prompts)
    idx = torch.tensor([[pad_token] * (T - len(p)) + p for p in prompts], dtype=torch.long)
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
    return idx, mask


def own_storage(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor itself when it is the whole of its storage, else a copy that is: a model that took a view (GPT-2's
    positions cut to block_size) would keep, and save, all of the storage it views."""
    if tensor.is_contiguous() and tensor.untyped_storage().nbytes() == tensor.nbytes:  # (so its offset is 0)
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


class KVCache:
    """Keys and values of every layer for the tokens decoded so far: per layer, one preallocated tensor of keys and
    one of values, each [B, n_head, block_size, head_size], written in place (no torch.cat per token)."""

    def __init__(self, config: GPTConfig, batch_size: int, device: torch.device, dtype: torch.dtype) -> None:
        shape = (batch_size, config.n_head, config.block_size, config.n_embd // config.n_head)
        self.keys = [torch.empty(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.values = [torch.empty(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.length = 0  # positions filled
        self.start = 0  # index, in the decoded sequence, of the token cached at position 0

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's k, v ([B, nh, T, hs]) for one layer; return all keys and values so far."""
        end = self.length + k.size(2)
        self.keys[layer][:, :, self.length : end] = k
        self.values[layer][:, :, self.length : end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        # query, key and value projections for all heads, in one matrix
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.dropout = config.dropout

    def forward(
        self, x: torch.Tensor, kv_cache: KVCache | None = None, layer: int = 0, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """mask: None where causal attention needs none (a pass without a cache, or one new token after it), else
        which keys each query may see, [T, keys] or [B, 1, T, keys] (GPT.hidden_states builds it)."""
        B, T, C = x.size()
        # [B, T, 3C] -> three views of shape [B, n_head, T, head_size] (one reshape, no copies)
        q, k, v = self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4).unbind(0)
        if kv_cache is not None:
            k, v = kv_cache.append(layer, k, v)
        # Without a mask, the T queries are causal among themselves alone, or one new token sees every cached key
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=mask is None and k.size(2) == T,
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble the heads side by side
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate=config.gelu)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.post = config.norm_position == "post"
        # pre-norm: each norm's output goes to its sublayer's first Linear only
        self.ln_1 = new_norm(config, feeds_linear=not self.post)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = new_norm(config, feeds_linear=not self.post)
        self.mlp = MLP(config)

    def forward(
        self, x: torch.Tensor, kv_cache: KVCache | None = None, layer: int = 0, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.post:  # normalize the residual stream after each add
            x = self.ln_1(x + self.attn(x, kv_cache, layer, mask))
            return self.ln_2(x + self.mlp(x))
        x = x + self.attn(self.ln_1(x), kv_cache, layer, mask)  # normalize only what each sublayer reads
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                # Post-norm keeps no ln_f, as the original Transformer: its last block already ends in a norm (a second
                # would only add a redundant scale and shift). Identity keeps the name; the state_dict has no ln_f keys.
                ln_f=new_norm(config, feeds_linear=True) if config.norm_position == "pre" else nn.Identity(),
            )
        )
        self.embed_scale = nn.Parameter(torch.tensor(math.sqrt(config.n_embd))) if config.embed_scale else None
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # Weight tying: the output projection is the token embedding (Press & Wolf, 2017).
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        # GPT-2's scaled init of the projections that write into the residual stream.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @classmethod
    def from_seed(cls, config: GPTConfig, seed: int) -> GPT:
        """A new GPT whose initial weights are drawn from `seed`: the one place a fresh model is seeded (it seeds
        torch's global generator, as nanoGPT's train.py does before building its model)."""
        torch.manual_seed(seed)
        return cls(config)

    @classmethod
    def from_checkpoint(cls, checkpoint: dict[str, Any], norm: str | None = None, **changes: Any) -> GPT:
        """The GPT a checkpoint describes, with its weights, on the CPU in eval mode: the one place a model is built
        from saved arguments (nanoGPT's from_pretrained, for this project's checkpoints). `changes` replace fields
        of its model_args (a resume's dropout); `norm` swaps in another of layernorm.LAYERNORMS, which compute one
        function from one parameter layout. A norm that computes another function, or weights that do not fit the
        model the arguments describe, is a ValueError saying which."""
        config = GPTConfig.from_options(checkpoint["model_args"], **changes)
        if norm is not None and norm != config.norm:
            if not (norm in LAYERNORMS and config.norm in LAYERNORMS):
                others = ", ".join(LAYERNORMS) if config.norm in LAYERNORMS else repr(config.norm)
                raise ValueError(
                    f"this checkpoint was trained with norm={config.norm!r}; it can run with {others} "
                    f"but not with {norm!r}, which computes a different function"
                )
            config = replace(config, norm=norm)
        with nothing_drawn():  # the model's shape, without weights: no memory, no random init drawn
            model = cls(config)
        try:  # the model takes the checkpoint's tensors themselves (assign): the weights are in memory once
            model.load_state_dict({k: own_storage(v) for k, v in checkpoint["model"].items()}, assign=True)
        except RuntimeError as e:  # keys missing or unexpected, a shape that differs: torch's second line names them
            # the second line names the keys: all of them, for weights of another model; the first few tell it
            why = textwrap.shorten((str(e).splitlines()[1:] or [str(e)])[0], 240, placeholder=" ...")
            raise ValueError(f"the checkpoint's weights do not fit its model: {why}") from None
        model.transformer.wte.weight = model.lm_head.weight  # assign replaced both Parameters: tie them again
        return model.eval()

    def _init_weights(self, module: nn.Module) -> None:
        # Norms keep their own init (weight 1, bias 0), whichever implementation they are.
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def get_num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; the position embedding is left out by default (the token one is tied to the head)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wpe.weight.numel()
        return n

    def hidden_states(
        self, idx: torch.Tensor, kv_cache: KVCache | None = None, pad: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Token ids [B, T] -> final normalized activations [B, T, C]; with a cache, positions continue it. pad [B]:
        how many of each row's first tokens (counted from the cache's first, with a cache) are left padding, which
        no token sees; each row's positions count from its first real token, so a row computes as it would alone."""
        B, T = idx.size()
        start = kv_cache.length if kv_cache is not None else 0
        if start + T > self.config.block_size:
            raise ValueError(
                f"sequence of {start + T} tokens is longer than block_size {self.config.block_size}: "
                f"crop the context to the last {self.config.block_size} tokens"
            )
        pos = torch.arange(start, start + T, dtype=torch.long, device=idx.device)
        mask = None
        if pad is not None:
            pos = (pos - pad[:, None]).clamp(min=0)  # [B, T]; padding at 0 (it is seen by nothing)
            mask = padding_mask(pad, start, T)
        elif start > 0 and T > 1:  # query i sits at position start + i and may see keys 0..start + i
            mask = torch.ones(T, start + T, dtype=torch.bool, device=idx.device).tril(diagonal=start)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        x = self.transformer.drop(x if self.embed_scale is None else x * self.embed_scale)
        for layer, block in enumerate(self.transformer.h):
            x = block(x, kv_cache, layer, mask)
        if kv_cache is not None:
            kv_cache.length += T
        return self.transformer.ln_f(x)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, kv_cache: KVCache | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits for every position, [B, T, vocab_size], and the mean cross-entropy when targets are given."""
        logits = self.lm_head(self.hidden_states(idx, kv_cache))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizers(
        self, weight_decay: float, learning_rate: float, betas: tuple[float, float], device_type: str
    ) -> torch.optim.AdamW:
        """AdamW with weight decay on the Linear layers' weights only: never on norms, biases or embeddings."""
        decay_ids = {id(m.weight) for m in self.modules() if isinstance(m, nn.Linear) and m is not self.lm_head}
        decay = [p for p in self.parameters() if id(p) in decay_ids]  # (tied weights appear once)
        no_decay = [p for p in self.parameters() if id(p) not in decay_ids]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        # One fused kernel for every parameter where torch has one (CPU, CUDA, MPS): the same update as the default
        # loop over the parameters (on a CPU: several small ops per parameter), in a fraction of the time.
        fused = device_type in ("cpu", "cuda", "mps")
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused or None)

    @torch.inference_mode()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        use_kv_cache: bool = True,
        generator: torch.Generator | None = None,
        return_logits: bool = False,
        attention_mask: torch.Tensor | None = None,
        stop_token: int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Continue each row of idx [B, T] by up to max_new_tokens tokens, decoded as `stream` decodes. Returns the
        tokens [B, T + steps], and with return_logits=True also the logits each step sampled from,
        [B, steps, vocab_size]: steps is max_new_tokens unless every row reached stop_token before."""
        tokens = [idx]
        all_logits = []
        for next_tokens, logits in self.stream(
            idx, max_new_tokens, temperature, top_k, use_kv_cache, generator, attention_mask, stop_token
        ):
            tokens.append(next_tokens)
            if return_logits:  # kept only when asked: [B, vocab_size] per step adds up
                all_logits.append(logits)
        if not return_logits:
            return torch.cat(tokens, dim=1)
        empty = torch.zeros(idx.size(0), 0, self.config.vocab_size, device=idx.device)
        return torch.cat(tokens, dim=1), torch.stack(all_logits, dim=1) if all_logits else empty

    def stream(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        use_kv_cache: bool = True,
        generator: torch.Generator | None = None,
        attention_mask: torch.Tensor | None = None,
        stop_token: int | None = None,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Decode max_new_tokens tokens after idx [B, T] one step at a time (temperature 0: greedily; past
        block_size: see the module docstring): yields each step's next tokens [B, 1] and the logits [B, V] they
        were picked from, as soon as they are known. Prompts of different lengths come left padded, with
        transformers' attention_mask [B, T] (1: a token, 0: padding; pad_left makes both): each row then decodes as
        it would alone, its positions and its keys its own. A row that picks stop_token (the tokenizer's end of
        text, say) has ended: its later tokens are stop_token again, and the stream ends when every row has. The
        arguments are checked here, before any step runs."""
        if not temperature >= 0:  # also catches NaN
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {temperature}")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be a positive integer or None, got {top_k}")
        if idx.dim() != 2 or idx.size(1) == 0:
            raise ValueError(f"idx must be token ids of shape [B, T] with T >= 1, got shape {list(idx.shape)}")
        pad = None  # [B]: how many of each row's first tokens are left padding
        if attention_mask is not None:  # transformers' mask: 1 a token, 0 padding
            if attention_mask.shape != idx.shape:
                raise ValueError(
                    f"attention_mask must have idx's shape {list(idx.shape)}, got {list(attention_mask.shape)}"
                )
            pad = (attention_mask == 0).sum(1)
            left = torch.equal(attention_mask.bool(), torch.arange(idx.size(1), device=idx.device) >= pad[:, None])
            if not left or bool((pad == idx.size(1)).any()):
                raise ValueError(
                    "attention_mask must be left padding: each row 0s, then 1s (at least one), nothing else"
                )
            pad = pad if bool(pad.any()) else None  # no padding: the masks of a batch without one
        cache = KVCache(self.config, idx.size(0), idx.device, self.lm_head.weight.dtype) if use_kv_cache else None

        @torch.inference_mode()  # a generator, so the checks above run at the call, not at the first step
        def steps(context: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            ended = torch.zeros(context.size(0), 1, dtype=torch.bool, device=context.device)
            for _ in range(max_new_tokens):
                logits = self._next_token_logits(context, cache, pad)  # [B, V]
                if temperature == 0:  # greedy
                    next_tokens = logits.argmax(dim=-1, keepdim=True)
                else:  # sample from logits / temperature, among the top_k likeliest tokens when given
                    scaled = logits.float() / temperature
                    if top_k is not None:
                        v, _ = torch.topk(scaled, min(top_k, scaled.size(-1)))
                        scaled[scaled < v[:, [-1]]] = -float("inf")
                    probs = F.softmax(scaled, dim=-1)
                    next_tokens = torch.multinomial(probs, num_samples=1, generator=generator)  # [B, 1]
                if stop_token is not None:
                    next_tokens = next_tokens.masked_fill(ended, stop_token)
                    ended |= next_tokens == stop_token
                context = torch.cat((context, next_tokens), dim=1)
                yield next_tokens, logits
                if stop_token is not None and bool(ended.all()):
                    return

        return steps(idx)

    def _next_token_logits(self, idx: torch.Tensor, cache: KVCache | None, pad: torch.Tensor | None) -> torch.Tensor:
        """Logits [B, V] for the token after idx [B, T], whose rows start with pad [B] padding tokens (or None): from
        a window of the context (module docstring)."""
        block = self.config.block_size
        if cache is None:  # recompute the last block_size tokens
            first = max(0, idx.size(1) - block)
            new_tokens = idx[:, first:]
        else:
            if idx.size(1) - cache.start > block:
                # What the cache holds plus the new tokens would not fit: prefill a fresh window, a whole block at
                # the start (as much of the prompt as fits), half a block when a full cache overflows.
                keep = block if cache.length == 0 else max(1, block // 2)
                cache.length = 0  # forget it all; cache again from token `start`
                cache.start = idx.size(1) - keep
            first = cache.start  # the token at the cache's position 0
            new_tokens = idx[:, cache.start + cache.length :]
        window_pad = None if pad is None else (pad - first).clamp(min=0)  # the padding left in the window
        return self.lm_head(self.hidden_states(new_tokens, cache, window_pad)[:, -1, :])


GPT2_SIZES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")  # OpenAI's GPT-2 on the Hugging Face hub, 124M to 1.5B
# Hugging Face GPT-2 config entries (absent: its default, given here) and the one value this GPT computes
GPT2_FIXED = {
    "model_type": "gpt2",  # GPT-2's architecture (distilgpt2's too)
    "layer_norm_epsilon": 1e-5,  # every norm's eps here
    "n_inner": None,  # the MLP's width: None is 4 * n_embd
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "tie_word_embeddings": True,
    "add_cross_attention": False,
}
GPT2_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}  # activation_function -> GPTConfig.gelu
GPT2_SHAPE = ("vocab_size", "n_layer", "n_head", "n_embd")
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


HUB_GPT2 = "openai-community"  # the hub's owner of GPT2_SIZES: "gpt2" there is "openai-community/gpt2"
# What save_pretrained writes, one of: all weights in one file; shards named by an index (its "weight_map"); or,
# before transformers 4.35 (or with safe_serialization=False), one pickled state dict
SAFETENSORS, INDEX, PICKLED = "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"


def is_hub_id(source: str) -> bool:
    """Whether `source` names a repository on the Hugging Face hub: owner/name, or one of the short ids of GPT-2's
    architecture."""
    return source in (*GPT2_SIZES, "distilgpt2") or re.fullmatch(r"[\w.-]+/[\w.-]+", source) is not None


def gpt2_folder(source: str) -> Path:
    """The folder of a GPT-2 `source`: a folder, or a hub id (one of GPT2_SIZES, openai-community/gpt2*, or any
    repository of GPT-2's architecture such as distilgpt2) downloaded once into the Hugging Face cache: config.json
    and the safetensors weights, else pytorch_model.bin."""
    folder = Path(source)
    if folder.is_dir():
        return folder
    if folder.exists():
        raise ValueError(f"{source} is a file: give the folder holding config.json and the weights")
    if not is_hub_id(source):
        raise ValueError(
            f"{source} is neither a folder nor a hub id ({', '.join(GPT2_SIZES)}, distilgpt2 or owner/name such as "
            f"{HUB_GPT2}/gpt2)"
        )
    repo = f"{HUB_GPT2}/{source}" if source in GPT2_SIZES else source
    try:
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(repo, allow_patterns=["config.json", "*.safetensors", INDEX]))
        if not (folder / SAFETENSORS).is_file() and not (folder / INDEX).is_file():  # an older repository
            folder = Path(snapshot_download(repo, allow_patterns=["config.json", PICKLED]))
    except ImportError as e:
        raise ValueError(f"downloading {repo} needs {e.name}: pip install huggingface_hub") from None
    except Exception as e:  # offline, the hub unreachable, no such repository: what huggingface_hub raises varies
        raise ValueError(
            f"{source} is not a folder here, and downloading {repo} from the Hugging Face hub failed "
            f"({type(e).__name__}); on a machine with internet run `hf download {repo} config.json model.safetensors "
            f"--local-dir {Path(repo).name}`, copy that folder here and give its path"
        ) from None
    return folder


def gpt2_tensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every (name, tensor) of the weights save_pretrained wrote in `folder`, one tensor read at a time: the
    caller keeps what it needs, so that the weights are in memory once. pytorch_model.bin is read with
    weights_only=True: tensors only, no pickled code run."""
    if (folder / INDEX).is_file() and not (folder / SAFETENSORS).is_file():
        weight_map = json.loads((folder / INDEX).read_text(encoding="utf-8"))["weight_map"]
        for shard in dict.fromkeys(weight_map.values()):  # each shard once, in order
            yield from read_safetensors(folder / shard)
    elif (folder / PICKLED).is_file() and not (folder / SAFETENSORS).is_file():
        state = torch.load(folder / PICKLED, map_location="cpu", weights_only=True)
        while state:
            yield state.popitem()
    else:  # (where there is none, the error names model.safetensors)
        yield from read_safetensors(folder / SAFETENSORS)


SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def read_safetensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs of a safetensors file, each read from the file into memory of its own. The format:
    8 bytes giving the header's length n (little-endian), n bytes of JSON naming each tensor's dtype, shape and
    [begin, end) bytes in the data that follows. (safetensors' own reader maps the whole file into memory: a
    Conv1D weight transposed from there would keep the file's pages resident beside its copy.)"""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        n = int.from_bytes(f.read(8), "little")
        if n > size - 8:  # (random bytes give a header length of exabytes, which f.read(n) would allocate)
            raise ValueError(
                f"{path.name} is not a safetensors file: its header would be {n:,} bytes of a {size:,}-byte file"
            )
        header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):  # the file's order
            begin, end = entry["data_offsets"]
            if not 0 <= begin <= end <= size - 8 - n:  # else bytes of the header, or none (what torch.empty left)
                raise ValueError(
                    f"{path.name}: tensor {name} is bytes [{begin}, {end}), outside the file's {size - 8 - n:,} bytes "
                    f"of data"
                )
            data = torch.empty(end - begin, dtype=torch.uint8)
            f.seek(8 + n + begin)
            f.readinto(data.numpy())
            yield name, data.view(SAFETENSORS_DTYPES[entry["dtype"]]).view(entry["shape"])


GPT2_FOLDER = (
    f"give a folder that transformers' save_pretrained wrote for GPT-2: config.json beside {SAFETENSORS}, or {INDEX} "
    f"and its shards, or {PICKLED}"
)


def unreadable(e: Exception) -> str:
    """Why a GPT-2 file could not be read, in words: the file missing, an entry missing, or the error's first line
    (a pickle holding more than tensors is not loaded: torch's own advice to load it anyway is left out)."""
    if isinstance(e, FileNotFoundError):
        return f"there is no {Path(e.filename).name}"
    if isinstance(e, KeyError):
        return f"it has no {e.args[0]!r}"
    if isinstance(e, pickle.UnpicklingError) and str(e).startswith("Weights only load failed"):
        return f"{PICKLED} holds objects other than tensors; nothing in it was run"
    first = str(e).partition("\n")[0]
    return first if type(e) is ValueError else f"{type(e).__name__}: {first}"  # (ValueError: ours, or as good)


def gpt2_checkpoint(source: str) -> dict[str, Any]:
    """GPT-2's weights as a checkpoint that GPT.from_checkpoint builds (its norm swap and refusals included; norm
    builtin, as GPT-2 was trained): `source` is a folder that save_pretrained wrote, or a hub id (gpt2_folder).
    Read with torch and json (huggingface_hub only to download), never transformers. Hugging Face's GPT-2 is this
    GPT under other names: no "transformer." in OpenAI's files, causal masks saved as "attn.bias", lm_head tied to
    wte, and Conv1D layers that keep a Linear's weight transposed, [in, out]. Whatever the folder holds that this
    GPT cannot read or compute is one ValueError naming config.json or the folder's weights and the cause (a file
    or an entry missing, a file cut short, weights of another shape, another activation); weights that are not
    finite are refused too, here where they enter."""
    folder = gpt2_folder(source)
    config_json = folder / "config.json"
    try:
        hf = json.loads(config_json.read_text(encoding="utf-8"))
        activation = hf.get("activation_function", "gelu_new")
        shape = {k: hf[k] for k in GPT2_SHAPE}
        config = GPTConfig(
            block_size=hf["n_positions"], **shape, dropout=0.0, norm="builtin", gelu=GPT2_GELU.get(activation, "none")
        )
    except Exception as e:  # missing, not JSON, not an object, a size missing or out of range
        raise ValueError(f"{config_json} is not GPT-2's config.json ({unreadable(e)}); {GPT2_FOLDER}") from None
    wrong = [f"{k}={hf[k]!r} (only {v!r})" for k, v in GPT2_FIXED.items() if hf.get(k, v) != v]
    if activation not in GPT2_GELU:
        wrong.append(f"activation_function={activation!r} (only {', '.join(GPT2_GELU)})")
    if wrong:  # a model that runs, computing another function than the one its weights were trained for
        raise ValueError(f"{config_json}: this GPT does not compute {'; '.join(wrong)}")
    try:
        state = {}
        for key, tensor in gpt2_tensors(folder):
            name = key.removeprefix("transformer.")
            if not name.endswith((".attn.bias", ".attn.masked_bias")) and name != "lm_head.weight":  # masks; tied head
                tensor = tensor.to(torch.float32)  # (no copy when it is float32 already)
                state[f"transformer.{name}"] = tensor.t().contiguous() if name.endswith(CONV1D) else tensor
        if "transformer.wte.weight" in state:  # (else the model names it missing)
            state["lm_head.weight"] = state["transformer.wte.weight"]
        checkpoint = {"model_args": asdict(config), "model": state}
        GPT.from_checkpoint(checkpoint)  # a tensor missing, another shape: its ValueError names it
    except Exception as e:  # torch's, the format's or ours: whatever the weight files do not hold, in one line
        raise ValueError(f"the weights in {folder} are not GPT-2's ({unreadable(e)}); {GPT2_FOLDER}") from None
    if bad := [k.removeprefix("transformer.") for k, t in state.items() if not bool(t.isfinite().all())]:
        raise ValueError(
            f"the weights in {folder} are not finite (NaN or inf) in {len(bad)} tensors ({', '.join(bad[:3])}"
            f"{', ...' if len(bad) > 3 else ''}): the weights are damaged; copy them again from where they came from"
        )
    return checkpoint


def gpt2_export(model: GPT, folder: str | Path) -> Path:
    """Write `model` as a Hugging Face GPT-2 folder (the inverse of gpt2_checkpoint): config.json and
    model.safetensors, "transformer." names, the Conv1D weights transposed back to [in, out], the head left tied,
    that GPT2LMHeadModel.from_pretrained (and gpt2_checkpoint) loads. bias=False is written as zero biases, the same
    function. A ValueError says what transformers' GPT-2 does not compute: a norm other than LayerNorm,
    post-norm, the embedding scale."""
    c = model.config
    wrong = [] if c.norm in LAYERNORMS else [f"norm={c.norm!r} (only LayerNorm: {', '.join(LAYERNORMS)})"]
    wrong += ["norm_position='post' (only 'pre')"] if c.norm_position != "pre" else []
    wrong += ["embed_scale=True (no scale of the embeddings)"] if c.embed_scale else []
    if wrong:
        raise ValueError(f"transformers' GPT-2 does not compute this model's {'; '.join(wrong)}")
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {}
    for name, tensor in model.state_dict().items():
        if name != "lm_head.weight":  # tied to wte
            state[name] = (tensor.t() if name.endswith(CONV1D) else tensor).detach().float().cpu().contiguous()
    if not c.bias:  # transformers' Conv1D and LayerNorm have biases: zeros compute what none does
        for name in [n for n in state if n.endswith(".weight") and "wte" not in n and "wpe" not in n]:
            state[name.removesuffix("weight") + "bias"] = torch.zeros(state[name].size(-1))
    save_file(state, folder / SAFETENSORS, metadata={"format": "pt"})
    eot = 50256 if c.vocab_size > 50256 else None  # GPT-2's <|endoftext|>, where the vocabulary has it
    config = {
        "architectures": ["GPT2LMHeadModel"],
        **GPT2_FIXED,
        "activation_function": {"tanh": "gelu_new", "none": "gelu"}[c.gelu],
        "n_positions": c.block_size,
        **{k: getattr(c, k) for k in GPT2_SHAPE},
        **{k: c.dropout for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop")},
        "bos_token_id": eot,
        "eos_token_id": eot,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return folder
