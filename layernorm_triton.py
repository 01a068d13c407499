"""LayerNorm as two fused Triton kernels, forward and backward, each beside its launcher.

The math is `layernorm.layer_norm`'s (read that first): the same shift by the row's first element, two-pass
statistics in float32, and the backward derived there,

    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),   g = dy * w,   dw = sum_rows dy * xhat,   db = sum_rows dy

What fusing buys: each kernel reads its inputs once and writes its outputs once, with every intermediate (the
centred row, xhat, g) kept in registers, where the torch version makes a pass over memory per operation.

A leaf: it imports only torch and triton. `layernorm.TritonLayerNorm` builds on it, imports it when the first one
is built, and checks its inputs (layernorm.check_args says what is valid). Kernels run on CUDA tensors, or on CPU
tensors through Triton's interpreter when TRITON_INTERPRET=1 was set before this module was imported (triton.jit
chooses interpreter or compiler when a kernel is defined; INTERPRET below records which).
"""

import functools
import os
from contextlib import nullcontext

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # fixed now, when the kernels below are defined
MAX_BLOCK = 8192  # widest block (columns) one program holds in registers; wider rows loop over blocks
# The backward's row loop is software-pipelined (the next row's loads issue while this row computes) where the
# installed Triton has tl.range(num_stages=...); older ones run a plain loop.
PIPELINE = hasattr(tl, "range")


# ----------------------------------------------------------------------------------------------------------------
# Forward: one program normalizes one row. It saves rstd and mean_s, the mean of x - x_0 (not of x): the backward
# re-reads x_0 and centres the row exactly as the forward did. (A float32 mean of a row at 1e4 is off by up to
# 5e-4, which x - mean would inherit.) A row that fits one block is loaded once and stays in registers; a wider
# row is read in blocks of BLOCK_SIZE columns, once per pass (the re-reads come from cache).


@triton.jit
def layer_norm_fwd_kernel(
    X, Y, W, B, MeanS, Rstd,  # pointers: x, y [N, C] (row strides below); w, b [C]; mean_s, rstd [N] float32
    stride_x, stride_y, C, eps,
    HAS_BIAS: tl.constexpr, BLOCK_SIZE: tl.constexpr, ONE_BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # 64-bit, so row * stride cannot wrap past 2**31 elements
    X += row * stride_x
    Y += row * stride_y
    shift = tl.load(X).to(tl.float32)  # x_0
    if ONE_BLOCK:
        cols = tl.arange(0, BLOCK_SIZE)
        mask = cols < C
        x = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
        xs = tl.where(mask, x - shift, 0.0)  # padding columns must add nothing to the sums
        mean_s = tl.sum(xs, axis=0) / C
        xc = tl.where(mask, xs - mean_s, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / C + eps)
        y = xc * rstd * tl.load(W + cols, mask=mask).to(tl.float32)
        if HAS_BIAS:
            y += tl.load(B + cols, mask=mask).to(tl.float32)
        tl.store(Y + cols, y.to(Y.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
        for off in range(0, C, BLOCK_SIZE):  # pass 1: mean of the shifted row
            cols = off + tl.arange(0, BLOCK_SIZE)
            x = tl.load(X + cols, mask=cols < C, other=0.0).to(tl.float32)
            acc += tl.where(cols < C, x - shift, 0.0)
        mean_s = tl.sum(acc, axis=0) / C
        acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
        for off in range(0, C, BLOCK_SIZE):  # pass 2: variance of the centred row
            cols = off + tl.arange(0, BLOCK_SIZE)
            x = tl.load(X + cols, mask=cols < C, other=0.0).to(tl.float32)
            xc = tl.where(cols < C, x - shift - mean_s, 0.0)
            acc += xc * xc
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / C + eps)
        for off in range(0, C, BLOCK_SIZE):  # pass 3: normalize, scale, shift, store
            cols = off + tl.arange(0, BLOCK_SIZE)
            mask = cols < C
            x = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
            y = (x - shift - mean_s) * rstd * tl.load(W + cols, mask=mask).to(tl.float32)
            if HAS_BIAS:
                y += tl.load(B + cols, mask=mask).to(tl.float32)
            tl.store(Y + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(MeanS + row, mean_s)
    tl.store(Rstd + row, rstd)


@functools.cache
def block_config(C: int, max_block: int = MAX_BLOCK) -> tuple[int, bool, int]:
    """(BLOCK_SIZE, ONE_BLOCK, num_warps) for rows of C features, computed once per C.

    BLOCK_SIZE is a power of two >= C when the row fits one block, else max_block; one warp per 256 columns
    (8 per thread), at most 8, or 16 for the widest blocks.
    """
    block = min(triton.next_power_of_2(C), max_block)
    return block, C <= block, min(max(block // 256, 1), 8 if block < 8192 else 16)


def launch_device(device: torch.device):
    """Triton launches on the current CUDA device's stream: make it the tensors' own (cuda:1 launches on cuda:1)."""
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()


def _rows(t: torch.Tensor, C: int) -> torch.Tensor:
    """t as [N, C] with contiguous columns; rows may keep their stride (a stride-0 expanded x reads one row)."""
    t2 = t.reshape(-1, C)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def forward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, max_block: int = MAX_BLOCK
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the forward kernel: (y like x; mean_s = mean of x - x_0, and rstd: float32 [*x.shape[:-1]])."""
    C = x.shape[-1]
    x2 = _rows(x, C)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    mean_s = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    rstd = torch.empty_like(mean_s)
    if x2.shape[0] == 0:
        return y, mean_s, rstd
    block, one_block, warps = block_config(C, max_block)
    w = weight.contiguous()
    b = w if bias is None else bias.contiguous()  # a placeholder pointer, never read when HAS_BIAS=False
    with launch_device(x.device):
        layer_norm_fwd_kernel[(x2.shape[0],)](
            x2, y, w, b, mean_s, rstd, x2.stride(0), C, C, eps,
            HAS_BIAS=bias is not None, BLOCK_SIZE=block, ONE_BLOCK=one_block, num_warps=warps,
        )
    return y, mean_s, rstd


# ----------------------------------------------------------------------------------------------------------------
# Backward. Program p takes a contiguous group of rows. For each row it recomputes the forward's
# xhat = (x - x_0 - mean_s) * rstd, forms g = dy * w, and writes dx, while it adds dy * xhat (and dy, with a bias)
# into its own float32 partial sums: row p of the [programs, C] slabs DW and DB of one buffer [2, programs, C].
# The launcher then sums the buffer over programs in one reduction: deterministic, no atomics, no locks.


@triton.jit
def _backward_row(X, DY, DX, MeanS, Rstd, C, cols, mask, w, dw, db):
    """One row of the one-block backward (pointers to its x, dy, dx, mean_s and rstd): stores its dx, returns dw
    and db with its dy * xhat and dy added."""
    x = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + cols, mask=mask, other=0.0).to(tl.float32)
    shift = tl.load(X).to(tl.float32)  # x_0, the forward's shift
    rstd = tl.load(Rstd)
    xhat = tl.where(mask, (x - shift - tl.load(MeanS)) * rstd, 0.0)
    g = dy * w  # zero in the padding columns, since dy and w are
    mean_gx = tl.sum(g * xhat, axis=0) / C
    mean_g = tl.sum(g, axis=0) / C
    dx = (g - mean_g - xhat * mean_gx) * rstd
    tl.store(DX + cols, dx.to(DX.dtype.element_ty), mask=mask)
    return dw + dy * xhat, db + dy  # (db is dropped by the caller when there is no bias)


@triton.jit
def layer_norm_bwd_kernel(
    DY, X, W, MeanS, Rstd, DX, DW, DB,  # DY, X, DX [N, C] (row strides below); DW, DB [programs, C] float32
    stride_dy, stride_x, stride_dx, N, C, rows_per_program,
    HAS_BIAS: tl.constexpr, BLOCK_SIZE: tl.constexpr, ONE_BLOCK: tl.constexpr, PIPELINE: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)  # 64-bit, and so are the row indices below
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, N)
    DW += pid * C  # this program's own row of the partial sums
    DB += pid * C
    if ONE_BLOCK:
        cols = tl.arange(0, BLOCK_SIZE)
        mask = cols < C
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        dw = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
        db = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
        if PIPELINE:  # the next row's loads issue while this row computes
            for r in tl.range(row_start, row_end, num_stages=2):
                x_r, dy_r, dx_r = X + r * stride_x, DY + r * stride_dy, DX + r * stride_dx
                dw, db = _backward_row(x_r, dy_r, dx_r, MeanS + r, Rstd + r, C, cols, mask, w, dw, db)
        else:
            for r in range(row_start, row_end):
                x_r, dy_r, dx_r = X + r * stride_x, DY + r * stride_dy, DX + r * stride_dx
                dw, db = _backward_row(x_r, dy_r, dx_r, MeanS + r, Rstd + r, C, cols, mask, w, dw, db)
        tl.store(DW + cols, dw, mask=mask)
        if HAS_BIAS:
            tl.store(DB + cols, db, mask=mask)
    else:  # wide rows: the same, block by block; the partial sums accumulate in this program's buffer row
        for r in range(row_start, row_end):
            shift = tl.load(X + r * stride_x).to(tl.float32)
            mean_s = tl.load(MeanS + r)
            rstd = tl.load(Rstd + r)
            acc_gx = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
            acc_g = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
            for off in range(0, C, BLOCK_SIZE):  # pass 1: the two row sums
                cols = off + tl.arange(0, BLOCK_SIZE)
                mask = cols < C
                x = tl.load(X + r * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(DY + r * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
                g = dy * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
                acc_gx += g * tl.where(mask, (x - shift - mean_s) * rstd, 0.0)
                acc_g += g
            mean_gx = tl.sum(acc_gx, axis=0) / C
            mean_g = tl.sum(acc_g, axis=0) / C
            for off in range(0, C, BLOCK_SIZE):  # pass 2: dx, and the partial sums of dw and db
                cols = off + tl.arange(0, BLOCK_SIZE)
                mask = cols < C
                x = tl.load(X + r * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(DY + r * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
                xhat = tl.where(mask, (x - shift - mean_s) * rstd, 0.0)
                g = dy * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
                dx = (g - mean_g - xhat * mean_gx) * rstd
                tl.store(DX + r * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
                tl.store(DW + cols, tl.load(DW + cols, mask=mask) + dy * xhat, mask=mask)
                if HAS_BIAS:
                    tl.store(DB + cols, tl.load(DB + cols, mask=mask) + dy, mask=mask)
            tl.debug_barrier()  # this row's updates of DW/DB are visible to every thread before the next


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def backward_programs(N: int, device: torch.device) -> int:
    """How many programs share the backward's N rows.

    On a GPU, 8 per SM (as flash-attention's LayerNorm): enough warps in flight to hide memory latency, while the
    partial sums stay small next to the rows (2 x 8 x 132 x C floats on an H200, against 3 x N x C elements of dy,
    x and dx). The interpreter runs programs one after another, so fewer is faster there.
    """
    return max(1, min(N, 8 * _sm_count(device) if device.type == "cuda" else 4))


def backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    mean_s: torch.Tensor,
    rstd: torch.Tensor,
    has_bias: bool = True,
    max_block: int = MAX_BLOCK,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Launch the backward kernel: (dx like x, dweight like weight, dbias like weight or None without a bias)."""
    C = x.shape[-1]
    x2 = _rows(x, C)
    dy2 = dy.reshape(-1, C)  # an expanded dy (stride 0) is copied here by reshape, or below
    dy2 = dy2 if dy2.stride(-1) == 1 and dy2.stride(0) != 0 else dy2.contiguous()
    N = x2.shape[0]
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    block, one_block, warps = block_config(C, max_block)
    programs = backward_programs(N, x.device)
    # one-block programs write their whole row of partial sums; the looped path adds into it, so starts from 0
    new = torch.empty if one_block and N > 0 else torch.zeros
    partial = new((1 + has_bias, programs, C), dtype=torch.float32, device=x.device)  # [dw (, db), P, C]
    if N > 0:
        with launch_device(x.device):
            layer_norm_bwd_kernel[(programs,)](
                dy2, x2, weight.contiguous(), mean_s, rstd, dx, partial[0], partial[-1],
                dy2.stride(0), x2.stride(0), C, N, C, -(-N // programs),  # rows per program, rounded up
                HAS_BIAS=has_bias, BLOCK_SIZE=block, ONE_BLOCK=one_block, PIPELINE=PIPELINE,
                num_warps=warps,
            )
    sums = partial.sum(1).to(weight.dtype)  # one deterministic reduction over the programs: [dw (, db), C]
    return dx, sums[0], sums[1] if has_bias else None


# ----------------------------------------------------------------------------------------------------------------
# Autograd. In eager mode a plain autograd.Function (the least Python per call). Under torch.compile the same
# launchers are torch.library custom ops, with fake implementations for their shapes, so a compiled model traces
# through them instead of breaking the graph.


class _LayerNormTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, mean_s, rstd = forward(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean_s, rstd)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, weight, mean_s, rstd = ctx.saved_tensors
        dx, dw, db = backward(dy, x, weight, mean_s, rstd, ctx.has_bias)
        return dx, dw, db, None


# (schemas spelled out: older torch cannot infer them from `Tensor | None` and tuple annotations)
@torch.library.custom_op(
    "layernorm::triton_fwd", mutates_args=(),
    schema="(Tensor x, Tensor weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)",
)
def triton_fwd(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return forward(x, weight, bias, eps)


@torch.library.custom_op(
    "layernorm::triton_bwd", mutates_args=(),
    schema="(Tensor dy, Tensor x, Tensor weight, Tensor mean_s, Tensor rstd, bool has_bias)"
    " -> (Tensor, Tensor, Tensor)",
)
def triton_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean_s: torch.Tensor, rstd: torch.Tensor, has_bias: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dx, dw, db = backward(dy, x, weight, mean_s, rstd, has_bias)
    # a custom op returns tensors, never None, and no two outputs may share memory (dw and db are rows of one sum)
    return dx, dw, torch.zeros_like(dw) if db is None else db.clone()


@triton_fwd.register_fake
def _(x, weight, bias, eps):
    stats = x.new_empty(x.shape[:-1], dtype=torch.float32)
    return torch.empty_like(x, memory_format=torch.contiguous_format), stats, torch.empty_like(stats)


@triton_bwd.register_fake
def _(dy, x, weight, mean_s, rstd, has_bias):
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    return dx, torch.empty_like(weight), torch.empty_like(weight)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, _eps = inputs
    _y, mean_s, rstd = output
    ctx.save_for_backward(x, weight, mean_s, rstd)
    ctx.has_bias = bias is not None
    ctx.set_materialize_grads(False)  # mean_s and rstd get no gradient: None, not two zero-filled tensors


def _backward_rule(ctx, dy, _dmean_s, _drstd):
    if dy is None:  # y itself was not used
        return None, None, None, None
    x, weight, mean_s, rstd = ctx.saved_tensors
    dx, dw, db = triton_bwd(dy, x, weight, mean_s, rstd, ctx.has_bias)
    return dx, dw, db if ctx.has_bias else None, None


triton_fwd.register_autograd(_backward_rule, setup_context=_setup_context)


def layer_norm_triton(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-5
) -> torch.Tensor:
    """LayerNorm over the last dimension of x (any shape [..., C]) with the fused Triton kernels.

    Same function and gradients as `layernorm.layer_norm` (population variance). The arguments are taken as
    checked: `layernorm.TritonLayerNorm` checks them, once per call.
    """
    if torch.compiler.is_compiling():
        return triton_fwd(x, weight, bias, float(eps))[0]
    return _LayerNormTriton.apply(x, weight, bias, float(eps))

