"""LayerNorm as two fused Triton kernels, forward and backward, each beside its launcher.

The math is `layernorm.layer_norm`'s (read that first): the same shift by the row's first element, two-pass
statistics in float32 (float64 for a float64 input), and the backward derived there,

    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),   g = dy * w,   dw = sum_rows dy * xhat,   db = sum_rows dy

What fusing buys: each kernel reads its inputs once and writes its outputs once, with every intermediate (the
centred row, xhat, g) kept in registers, where the torch version makes a pass over memory per operation.

A leaf: it imports only torch and triton; `layernorm.TritonLayerNorm` checks the inputs and calls it. Kernels run
on CUDA tensors, or on CPU tensors through Triton's interpreter where TRITON_INTERPRET=1 was set before the import.

Which path a call takes (`layer_norm_triton` decides; `_forward` and `_backward` are the launchers they share):

    call                                   forward                     backward               launch (`_launch`)
    eager, grad needed                     _LayerNormTriton.apply      its backward           kernel[grid]
    eager, no grad (decoding, eval)        _forward alone              -                      kernel[grid]
    under torch.compile                    the op layernorm::triton_fwd its registered rule   wrap_triton (TRITON_OP),
                                           (traced=True)               -> triton_bwd          else kernel[grid]

`traced` means "inside a torch.library op": there no two kernel arguments may share one tensor and no two outputs
one buffer, so an unused pointer gets a tensor of its own and dw, db come from two reductions. Eager mode does
neither: a small model's step is bound by the CPU launching kernels, so the eager paths keep their Python short.
"""

import functools
import os
from contextlib import nullcontext

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # as triton.jit reads it, when the kernels below are defined
MAX_BLOCK = 8192  # widest block (columns) one program holds in registers; wider rows loop over blocks
ONE_PROGRAM_ROWS = 32  # a backward of at most this many rows runs as one program (see _backward_programs)
# Under torch.compile: torch.library.triton_op (torch 2.6+) lets Inductor launch the kernels from its own code and
# CUDA graphs capture them; an interpreted kernel is no compiled one, so there, and on older torch, a custom op.
TRITON_OP = hasattr(torch.library, "triton_op") and not INTERPRET


# ----------------------------------------------------------------------------------------------------------------
# Forward: one program normalizes one row and saves mean_s (the mean of x - x_0, not of x) and rstd in stats [2, N],
# so that the backward centres the row exactly as the forward did. A wider row than one block is read block by block.


@triton.jit
def layer_norm_fwd_kernel(
    X,
    Y,
    W,
    B,
    Stats,  # pointers: x, y [N, C] (row strides below); w, b [C]; stats [2, N]: mean_s, rstd
    stride_x,
    stride_y,
    C,
    N,
    eps,
    HAS_BIAS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    ONE_BLOCK: tl.constexpr,
):
    acc = Stats.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)  # 64-bit, so row * stride cannot wrap past 2**31 elements
    X += row * stride_x
    Y += row * stride_y
    shift = tl.load(X).to(acc)  # x_0
    if ONE_BLOCK:
        cols = tl.arange(0, BLOCK_SIZE)
        mask = cols < C
        x = tl.load(X + cols, mask=mask, other=0.0).to(acc)
        xs = tl.where(mask, x - shift, 0.0)  # padding columns must add nothing to the sums
        mean_s = tl.sum(xs, axis=0) / C
        xc = tl.where(mask, xs - mean_s, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / C + eps)
        y = xc * rstd * tl.load(W + cols, mask=mask).to(acc)
        if HAS_BIAS:
            y += tl.load(B + cols, mask=mask).to(acc)
        tl.store(Y + cols, y.to(Y.dtype.element_ty), mask=mask)
    else:
        total = tl.zeros([BLOCK_SIZE], dtype=acc)
        for off in range(0, C, BLOCK_SIZE):  # pass 1: mean of the shifted row
            cols = off + tl.arange(0, BLOCK_SIZE)
            x = tl.load(X + cols, mask=cols < C, other=0.0).to(acc)
            total += tl.where(cols < C, x - shift, 0.0)
        mean_s = tl.sum(total, axis=0) / C
        total = tl.zeros([BLOCK_SIZE], dtype=acc)
        for off in range(0, C, BLOCK_SIZE):  # pass 2: variance of the centred row
            cols = off + tl.arange(0, BLOCK_SIZE)
            x = tl.load(X + cols, mask=cols < C, other=0.0).to(acc)
            xc = tl.where(cols < C, x - shift - mean_s, 0.0)
            total += xc * xc
        rstd = 1.0 / tl.sqrt(tl.sum(total, axis=0) / C + eps)
        for off in range(0, C, BLOCK_SIZE):  # pass 3: normalize, scale, shift, store
            cols = off + tl.arange(0, BLOCK_SIZE)
            mask = cols < C
            x = tl.load(X + cols, mask=mask, other=0.0).to(acc)
            y = (x - shift - mean_s) * rstd * tl.load(W + cols, mask=mask).to(acc)
            if HAS_BIAS:
                y += tl.load(B + cols, mask=mask).to(acc)
            tl.store(Y + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(Stats + row, mean_s)
    tl.store(Stats + N + row, rstd)


@functools.cache
def _block_config(C: int, max_block: int = MAX_BLOCK) -> tuple[int, bool, int]:
    """(BLOCK_SIZE, ONE_BLOCK, num_warps) for rows of C features, once per C: a power of two >= C where the row fits
    one block, else max_block; one warp per 256 columns (8 per thread), at most 8, or 16 for the widest blocks."""
    block = min(triton.next_power_of_2(C), max_block)
    return block, C <= block, min(max(block // 256, 1), 8 if block < 8192 else 16)


def _rows(t: torch.Tensor, C: int) -> tuple[torch.Tensor, int]:
    """(t as rows of C contiguous columns, the row stride): a contiguous t as it is (row r starts at r * C), else
    an [N, C] view where one serves; rows may keep their stride (a stride-0 expanded x reads one row)."""
    if t.is_contiguous():
        return t, C
    t2 = t.reshape(-1, C)
    return (t2, t2.stride(0)) if t2.stride(-1) == 1 else (t2.contiguous(), C)


def _forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
    out_dtype: torch.dtype | None = None,
    max_block: int = MAX_BLOCK,
    traced: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel: (y [x.shape] in out_dtype (x's by default), stats [2, N]: mean_s and rstd)."""
    C = x.shape[-1]
    x2, stride_x = _rows(x, C)
    N = x2.numel() // C
    y = torch.empty_like(x, dtype=out_dtype or x.dtype, memory_format=torch.contiguous_format)
    stats = torch.empty(2, N, dtype=torch.promote_types(x.dtype, torch.float32), device=x.device)
    if N:
        block, one_block, warps = _block_config(int(C), max_block)
        w = weight.contiguous()
        b = _unused_pointer(w, traced) if bias is None else bias.contiguous()
        args = (x2, y, w, b, stats, stride_x, C, C, N, eps, bias is not None, block, one_block)
        launch(layer_norm_fwd_kernel, (N,), args, traced, num_warps=warps)
    return y, stats


# ----------------------------------------------------------------------------------------------------------------
# Backward: program p takes a contiguous group of rows, recomputes each one's xhat = (x - x_0 - mean_s) * rstd,
# writes dx, and adds dy * xhat (and dy) into row p of the slabs DW, DB of one buffer [2, programs, C] (without a
# bias [1, programs, C]), which the launcher sums in one reduction: deterministic, no atomics.


@triton.jit
def _backward_row(X, DY, DX, MeanS, Rstd, C, cols, mask, w, dw, db):
    """One row of the one-block backward (pointers to its x, dy, dx, mean_s and rstd): stores its dx, returns dw
    and db with its dy * xhat and dy added."""
    acc = MeanS.dtype.element_ty
    x = tl.load(X + cols, mask=mask, other=0.0).to(acc)
    dy = tl.load(DY + cols, mask=mask, other=0.0).to(acc)
    shift = tl.load(X).to(acc)  # x_0, the forward's shift
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
    DY,
    X,
    W,
    Stats,
    DX,
    DW,
    DB,  # DY, X, DX [N, C] (row strides below); stats [2, N]; DW, DB [programs, C]
    stride_dy,
    stride_x,
    stride_dx,
    N,
    C,
    rows_per_program,
    HAS_BIAS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    ONE_BLOCK: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    acc = Stats.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)  # 64-bit, and so are the row indices below
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, N)
    MeanS, Rstd = Stats, Stats + N
    DW += pid * C  # this program's own row of the partial sums
    DB += pid * C
    if ONE_BLOCK:
        cols = tl.arange(0, BLOCK_SIZE)
        mask = cols < C
        w = tl.load(W + cols, mask=mask, other=0.0).to(acc)
        dw = tl.zeros([BLOCK_SIZE], dtype=acc)
        db = tl.zeros([BLOCK_SIZE], dtype=acc)
        for r in tl.range(row_start, row_end, num_stages=NUM_STAGES):  # 2: the next row's loads issue meanwhile
            x_r = X + r * stride_x
            dy_r = DY + r * stride_dy
            dx_r = DX + r * stride_dx
            dw, db = _backward_row(x_r, dy_r, dx_r, MeanS + r, Rstd + r, C, cols, mask, w, dw, db)
        tl.store(DW + cols, dw.to(DW.dtype.element_ty), mask=mask)
        if HAS_BIAS:
            tl.store(DB + cols, db.to(DB.dtype.element_ty), mask=mask)
    else:  # wide rows: the same, block by block; the partial sums accumulate in this program's buffer row
        for off in range(0, C, BLOCK_SIZE):  # which starts at zero (no separate launch to clear it)
            cols = off + tl.arange(0, BLOCK_SIZE)
            tl.store(DW + cols, tl.zeros([BLOCK_SIZE], dtype=acc), mask=cols < C)
            if HAS_BIAS:
                tl.store(DB + cols, tl.zeros([BLOCK_SIZE], dtype=acc), mask=cols < C)
        tl.debug_barrier()
        for r in range(row_start, row_end):
            shift = tl.load(X + r * stride_x).to(acc)
            mean_s = tl.load(MeanS + r)
            rstd = tl.load(Rstd + r)
            acc_gx = tl.zeros([BLOCK_SIZE], dtype=acc)
            acc_g = tl.zeros([BLOCK_SIZE], dtype=acc)
            for off in range(0, C, BLOCK_SIZE):  # pass 1: the two row sums
                cols = off + tl.arange(0, BLOCK_SIZE)
                mask = cols < C
                x = tl.load(X + r * stride_x + cols, mask=mask, other=0.0).to(acc)
                dy = tl.load(DY + r * stride_dy + cols, mask=mask, other=0.0).to(acc)
                g = dy * tl.load(W + cols, mask=mask, other=0.0).to(acc)
                acc_gx += g * tl.where(mask, (x - shift - mean_s) * rstd, 0.0)
                acc_g += g
            mean_gx = tl.sum(acc_gx, axis=0) / C
            mean_g = tl.sum(acc_g, axis=0) / C
            for off in range(0, C, BLOCK_SIZE):  # pass 2: dx, and the partial sums of dw and db
                cols = off + tl.arange(0, BLOCK_SIZE)
                mask = cols < C
                x = tl.load(X + r * stride_x + cols, mask=mask, other=0.0).to(acc)
                dy = tl.load(DY + r * stride_dy + cols, mask=mask, other=0.0).to(acc)
                xhat = tl.where(mask, (x - shift - mean_s) * rstd, 0.0)
                g = dy * tl.load(W + cols, mask=mask, other=0.0).to(acc)
                dx = (g - mean_g - xhat * mean_gx) * rstd
                tl.store(DX + r * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
                tl.store(DW + cols, tl.load(DW + cols, mask=mask) + dy * xhat, mask=mask)
                if HAS_BIAS:
                    tl.store(DB + cols, tl.load(DB + cols, mask=mask) + dy, mask=mask)
            tl.debug_barrier()  # this row's updates of DW/DB are visible to every thread before the next


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _backward_programs(N: int, device: torch.device) -> int:
    """How many programs share the backward's N rows. Up to ONE_PROGRAM_ROWS, one, which writes dw and db themselves:
    a launch saved weighs more than a few rows in parallel. Beyond, on a GPU 8 per SM (as flash-attention's LayerNorm):
    enough warps in flight to hide memory latency, while the partial sums stay small next to the rows (2 x 8 x 132 x
    C floats on an H200, against 3 x N x C of dy, x and dx). The interpreter, one program after another: 4."""
    if N <= ONE_PROGRAM_ROWS:
        return 1
    return min(N, 8 * _sm_count(device) if device.type == "cuda" else 4)


@functools.cache
def _shared_memory(device: torch.device) -> int:
    """Bytes of shared memory one program may use on a CUDA device (what Triton checks a compiled kernel against);
    the interpreter has no such limit."""
    if device.type != "cuda":
        return 2**31
    return triton.runtime.driver.active.utils.get_device_properties(device.index)["max_shared_mem"]


def _num_stages(block: int, x: torch.Tensor, dy: torch.Tensor) -> int:
    """The one-block backward's row loop: 2, pipelined (the next row's x and dy load while this row computes),
    where the pipeline's buffer, a block of x and one of dy in shared memory, fits the GPU; else 1, a plain loop.
    (A float64 row of 8192 needs 128 KiB, more than the 99 KiB of an RTX 30 or 40 series GPU.)"""
    buffer = block * (x.element_size() + dy.element_size())
    return 2 if buffer + 1024 <= _shared_memory(x.device) else 1


def _unused_pointer(like: torch.Tensor, traced: bool) -> torch.Tensor:
    """A pointer the kernel never reads (the bias's, with HAS_BIAS=False): `like` itself, or, traced, a tensor of
    its own (torch may take each tensor a traced kernel gets as written: of two copies the unwritten could win)."""
    return like.new_empty(1) if traced else like


def _backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    stats: torch.Tensor,
    has_bias: bool = True,
    max_block: int = MAX_BLOCK,
    traced: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Launch the backward kernel: (dx like x, dweight like weight, dbias like weight or None without a bias)."""
    C = x.shape[-1]
    x2, stride_x = _rows(x, C)
    dy2, stride_dy = _rows(dy, C)
    if stride_dy == 0:  # an expanded dy (stride 0 over rows) is written out: the kernel reads each of its rows
        dy2 = dy2.contiguous()
        stride_dy = C
    N = x2.numel() // C
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    block, one_block, warps = _block_config(int(C), max_block)
    programs = _backward_programs(N, x.device)
    one_program = programs == 1 and one_block and N > 0  # it writes dw and db themselves, in the weight's dtype
    if one_program:
        buffer = [torch.empty_like(weight) for _ in range(1 + has_bias)]
    else:
        new = torch.empty if N else torch.zeros  # (no rows: the sums are zero; otherwise the kernel writes them all)
        buffer = new(1 + has_bias, programs, C, dtype=stats.dtype, device=x.device)
    slabs = (buffer[0], buffer[1] if has_bias else _unused_pointer(buffer[0], traced))
    if N:
        tensors = (dy2, x2, weight.contiguous(), stats, dx, *slabs)
        rows_per_program = -(-N // programs)  # rounded up
        stages = _num_stages(block, x2, dy2) if one_block else 1
        args = (*tensors, stride_dy, stride_x, C, N, C, rows_per_program, has_bias, block, one_block, stages)
        launch(layer_norm_bwd_kernel, (programs,), args, traced, num_warps=warps)
    if one_program:
        return dx, slabs[0], slabs[1] if has_bias else None
    if traced:  # an op's outputs may not share memory: two reductions, not one
        return dx, slabs[0].sum(0).to(weight.dtype), slabs[1].sum(0).to(weight.dtype) if has_bias else None
    sums = buffer.sum(1).to(weight.dtype)  # one deterministic reduction over the programs: [dw (, db), C]
    return dx, sums[0], sums[1] if has_bias else None


# ----------------------------------------------------------------------------------------------------------------
# Launching, for these kernels and the batch-invariant mode's (batch_invariant/kernels.py). Triton launches on the
# current CUDA device's stream, so a launch is made with the tensors' device current (a model on cuda:1 must not
# launch on cuda:0); when it already is, nothing is switched. Eager, every call goes through Triton's own launch,
# kernel[grid], which binds the arguments and looks the compiled kernel up (its cost per call: python -m
# bench.kernels --overhead). Traced, wrap_triton hands the launch to Inductor.


def launch(
    kernel: triton.JITFunction, grid: tuple[int, ...], args: tuple, traced: bool = False, **options: int
) -> None:
    """kernel[grid](*args, **options), eager or (traced) inside a torch.library op."""
    if traced and TRITON_OP:
        torch.library.wrap_triton(kernel)[grid](*args, **options)
        return
    index = args[0].device.index if args[0].is_cuda else None
    switch = index is not None and index != torch.cuda.current_device()
    with torch.cuda.device(index) if switch else nullcontext():
        kernel[grid](*args, **options)


def autocast_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype autocast hands an op that runs in lower precision (a Linear, attention) for x: the autocast dtype
    where autocast is on for x's device, x's own where it is off or x is float64 (which autocast leaves alone)."""
    device_type = "cuda" if x.is_cuda else "cpu"
    if x.dtype == torch.float64 or not torch.is_autocast_enabled(device_type):
        return x.dtype
    return torch.get_autocast_dtype(device_type)


# ----------------------------------------------------------------------------------------------------------------
# Autograd: the paths of the module docstring's table; torch.library ops let a compiled model trace through the
# launchers instead of breaking the graph.


class _LayerNormTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, out_dtype):
        y, stats = _forward(x, weight, bias, eps, out_dtype)
        ctx.save_for_backward(x, weight, stats)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, weight, stats = ctx.saved_tensors
        dx, dw, db = _backward(dy, x, weight, stats, ctx.has_bias)
        return dx, dw, db, None, None


_define_op = torch.library.triton_op if TRITON_OP else torch.library.custom_op


# (schemas spelled out: older torch cannot infer them from `Tensor | None` and tuple annotations)
@_define_op(
    "layernorm::triton_fwd",
    mutates_args=(),
    schema="(Tensor x, Tensor weight, Tensor? bias, float eps, ScalarType out_dtype) -> (Tensor, Tensor)",
)
def _triton_fwd(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, out_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward(x, weight, bias, eps, out_dtype, traced=True)


@_define_op(
    "layernorm::triton_bwd",
    mutates_args=(),
    schema="(Tensor dy, Tensor x, Tensor weight, Tensor stats, bool has_bias) -> (Tensor, Tensor, Tensor)",
)
def _triton_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, stats: torch.Tensor, has_bias: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dx, dw, db = _backward(dy, x, weight, stats, has_bias, traced=True)
    return dx, dw, torch.zeros_like(dw) if db is None else db  # an op returns tensors, never None


if not TRITON_OP:  # a triton_op's shapes come from running it on fake tensors; a custom op is told them

    @_triton_fwd.register_fake
    def _(x, weight, bias, eps, out_dtype):
        N = x.numel() // x.shape[-1]
        stats = x.new_empty((2, N), dtype=torch.promote_types(x.dtype, torch.float32))
        return x.new_empty(x.shape, dtype=out_dtype), stats

    @_triton_bwd.register_fake
    def _(dy, x, weight, stats, has_bias):
        return x.new_empty(x.shape), torch.empty_like(weight), torch.empty_like(weight)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, _eps, _out_dtype = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.has_bias = bias is not None
    ctx.set_materialize_grads(False)  # stats get no gradient: None, not a zero-filled tensor


def _backward_rule(ctx, dy, _dstats):
    if dy is None:  # y itself was not used
        return None, None, None, None, None
    x, weight, stats = ctx.saved_tensors
    dx, dw, db = _triton_bwd(dy, x, weight, stats, ctx.has_bias)
    return dx, dw, db if ctx.has_bias else None, None, None


_triton_fwd.register_autograd(_backward_rule, setup_context=_setup_context)


def layer_norm_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    feeds_linear: bool = False,
) -> torch.Tensor:
    """LayerNorm over the last dimension of x [..., C] with the fused Triton kernels: `layernorm.layer_norm`'s
    function and gradients (population variance), y in x's dtype or, under autocast with feeds_linear=True (only a
    Linear reads y), in the autocast dtype: the values that Linear would have cast y to, without the cast. The
    arguments are taken as checked (`layernorm.TritonLayerNorm` does)."""
    out_dtype = autocast_dtype(x) if feeds_linear else x.dtype
    if torch.compiler.is_compiling():
        return _triton_fwd(x, weight, bias, float(eps), out_dtype)[0]
    bias_grad = bias is not None and bias.requires_grad
    wants_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or bias_grad)
    if not wants_grad:  # (decoding, evaluation): the forward alone, nothing for autograd to record
        return _forward(x, weight, bias, float(eps), out_dtype)[0]
    return _LayerNormTriton.apply(x, weight, bias, float(eps), out_dtype)
