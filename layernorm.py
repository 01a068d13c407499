"""Layer Normalization, three ways: from scratch, PyTorch's built-in, and a fused Triton kernel.

For one row x of C features (a token's activations), LayerNorm is

    mean = 1/C * sum_i x_i
    var  = 1/(C - correction) * sum_i (x_i - mean)^2        (correction=0: population variance, as nn.LayerNorm)
    rstd = 1 / sqrt(var + eps)
    xhat_i = (x_i - mean) * rstd                            (zero mean, unit variance)
    y_i    = xhat_i * weight_i + bias_i                     (a learned scale and shift per feature)

Every row is normalized on its own: no statistic crosses rows, so a token's output does not depend on the other
tokens of the batch. `BatchNorm` at the bottom of the file is the counter-example (statistics per feature over the
batch) and `RMSNorm` the simplification (no mean subtraction, no shift).

The file reads top to bottom:
  1. `layer_norm`: the forward in plain torch ops, with the backward derived by hand next to it;
  2. `layer_norm_triton`: the same forward and backward as two fused Triton kernels, each beside its launcher;
  3. the modules and the registry: `make_norm(name, dim)` and `NORMS`.
Triton is imported only when the Triton norm is built or used; `import layernorm` does not import it.
"""

import functools
import os

import torch
import torch.nn.functional as F
from torch import nn

NORMS: tuple[str, ...] = ("custom", "builtin", "triton", "rmsnorm", "batchnorm")
# Not a norm: make_norm("none", dim) is the identity, the no-normalization baseline of bench/compare_norms.py.
NO_NORM = "none"


# ----------------------------------------------------------------------------------------------------------------
# Checks shared by every implementation: bad input gets a clear error, never a wrong answer.


def _check_args(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"layer_norm expects a torch.Tensor input, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(
            f"layer_norm expects a floating-point input (float32, float64, bfloat16, float16), got {x.dtype}"
        )
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(
            f"layer_norm needs a last dimension of size >= 1 to normalize over, got shape {tuple(x.shape)}"
        )
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != tuple(x.shape[-1:]):
            raise ValueError(
                f"{name} has shape {tuple(p.shape)} but x has shape {tuple(x.shape)}: "
                f"{name} must have shape {tuple(x.shape[-1:])}, the size of x's last dimension"
            )
    if not eps > 0:  # also catches NaN
        raise ValueError(f"eps must be > 0 (it keeps 1/sqrt(var + eps) finite for a constant row), got {eps}")


# ----------------------------------------------------------------------------------------------------------------
# 1. From scratch: forward in torch ops, backward by hand.
#
# Forward, per row (C features, D = C - correction):
#     xs   = x - x_0                  shift by the row's first element: the sums below then see small numbers
#                                     even when the row sits at 1e4 (no cancellation), and a constant row is
#                                     exactly 0 (so y is exactly bias)
#     xc   = xs - mean(xs)            centred row (two passes: never E[x^2] - E[x]^2)
#     var  = |xc|^2 / D,  rstd = 1/sqrt(var + eps)
#     xhat = xc * rstd,   y = xhat * w + b
#
# Backward. Given dy = dL/dy:
#     db = sum over rows of dy                    y = ... + b
#     dw = sum over rows of dy * xhat             y = xhat * w + ...
#     g  = dy * w                                 g = dL/dxhat
# and for one row, xhat_i = (x_i - mean) * rstd depends on x_j through x_i, mean and rstd:
#     d xhat_i / d x_j = rstd * (delta_ij - 1/C - xhat_i * xhat_j / D)
# (d mean/d x_j = 1/C; d rstd/d x_j = -rstd^3 * (x_j - mean)/D = -rstd^2 * xhat_j / D). Summing g_i over i:
#     dx_j = rstd * (g_j - mean(g) - xhat_j * sum_i(g_i * xhat_i) / D)
# Three terms: the upstream gradient, minus its mean (the mean subtraction), minus its component along xhat
# (the division by the standard deviation). Only xhat and rstd are needed: they are what forward saves.


# Row blocks. Each torch op is one pass over memory, and LayerNorm does a few flops per byte, so its time is the
# number of passes times the memory bandwidth. The loops below do every pass of the forward (and of the backward)
# over one block of rows small enough to stay in the CPU's cache before moving to the next block: x is read from
# memory once and xhat and y are written once, while the passes in between run at cache speed. On a 2-core EPYC
# this cut forward+backward at [16384, 384] by 23-31% (one block against 2 MiB blocks, timed in turns). The fused
# Triton kernel takes the idea to its end: a row stays in registers and the forward is one pass. Off the CPU there
# is one block: each op there is a kernel launch, and a loop would only multiply the launches.
_CPU_BLOCK_BYTES = 2 << 20  # per [n, C] float32 buffer: a block's x, xhat and y (6 MiB) stay in a desktop L3


def _rows_per_block(rows: torch.Tensor) -> int:
    """How many rows of a [N, C] tensor make a block of about _CPU_BLOCK_BYTES (all of them off the CPU)."""
    N, C = rows.shape
    return max(1, _CPU_BLOCK_BYTES // (C * rows.element_size()) if rows.device.type == "cpu" else N)


def _row_blocks(n: int, *tensors: torch.Tensor | None):
    """The tensors' blocks of n rows (views), block by block; None stays None. One block is the tensors themselves:
    split costs about 10 us a tensor, which a small input notices."""
    N = len(tensors[0])
    if n >= N:
        return [tensors]
    count = -(-N // n)
    return zip(*(t.split(n) if t is not None else [None] * count for t in tensors), strict=True)


def _forward_block(x, xhat, rstd, y, w, b, eps, D) -> None:
    """The forward over one block of rows [n, C]: writes the block's xhat, rstd [n, 1] and y."""
    xs = x.to(xhat.dtype)  # float32 statistics for half/bfloat16 (a view for float32)
    torch.sub(xs, xs[:, :1], out=xhat)  # shift
    xhat.sub_(xhat.mean(-1, keepdim=True))  # centre
    # |xc|^2 through vector_norm: one fused reduction (torch.var is Welford, several times slower on CPU)
    var = torch.linalg.vector_norm(xhat, dim=-1, keepdim=True).square_().div_(D)
    torch.rsqrt(var.add_(eps), out=rstd)
    xhat.mul_(rstd)
    if b is None:
        torch.mul(xhat, w, out=y)
    else:
        torch.addcmul(b, xhat, w, out=y)  # computed in float32, rounded once to y's dtype


def _backward_block(dy, xhat, rstd, dx, buf, w, D, want_dweight, want_dbias):
    """The backward over one block of rows: writes the block's dx (unless dx is None) and returns its shares of
    dweight and dbias (None where not wanted). buf is float32 scratch of the block's shape."""
    dy = dy.to(xhat.dtype)
    p = torch.mul(dy, xhat, out=buf)  # dy * xhat
    dweight = p.sum(0) if want_dweight else None
    dbias = dy.sum(0) if want_dbias else None
    if dx is None:
        return dweight, dbias
    proj = torch.mv(p, w).div_(D).unsqueeze(-1)  # sum_i g_i * xhat_i / D, with g = dy * w: (dy * xhat) @ w
    g = torch.mul(dy, w, out=dx if dx.dtype == buf.dtype else buf)  # g = dL/dxhat, in dx itself for float32
    g.sub_(g.mean(-1, keepdim=True)).addcmul_(xhat, proj, value=-1).mul_(rstd)
    if g is not dx:
        dx.copy_(g)  # half/bfloat16: rounded once, at the end
    return dweight, dbias


class _LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, correction):
        C = x.shape[-1]
        compute = torch.promote_types(x.dtype, torch.float32)  # float32 stats for half/bfloat16 inputs
        x2 = x.reshape(-1, C)  # all leading dims are rows; a view when x is contiguous
        w = weight.to(compute)
        b = None if bias is None else bias.to(compute)
        xhat = x2.new_empty(x2.shape, dtype=compute)
        rstd = x2.new_empty((x2.shape[0], 1), dtype=compute)
        y = torch.empty_like(x2, memory_format=torch.contiguous_format)
        for block in _row_blocks(_rows_per_block(xhat), x2, xhat, rstd, y):
            _forward_block(*block, w, b, eps, C - correction)
        ctx.save_for_backward(xhat, rstd, weight)
        ctx.has_bias = bias is not None
        ctx.D = C - correction
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        return y.view(x.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        xhat, rstd, weight = ctx.saved_tensors
        N, C = xhat.shape
        dy2 = dy.reshape(-1, C)  # copies only when dy is non-contiguous in a way a view cannot express
        w = weight.to(xhat.dtype)
        wanted = ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]  # dweight, dbias
        dx = dy2.new_empty((N, C), dtype=ctx.x_dtype) if ctx.needs_input_grad[0] else None
        n = _rows_per_block(xhat)
        buf = xhat.new_empty((min(n, N), C))  # scratch for one block, reused
        dweight = dbias = None  # float32 sums over every row, block by block (a fixed order: deterministic)
        for dy_b, xhat_b, rstd_b, dx_b in _row_blocks(n, dy2, xhat, rstd, dx):
            dw_b, db_b = _backward_block(dy_b, xhat_b, rstd_b, dx_b, buf[: len(dy_b)], w, ctx.D, *wanted)
            dweight = dw_b if dweight is None else dweight.add_(dw_b)
            dbias = db_b if dbias is None else dbias.add_(db_b)
        dweight = None if dweight is None else dweight.to(weight.dtype)
        dbias = None if dbias is None else dbias.to(weight.dtype)
        return None if dx is None else dx.view(ctx.x_shape), dweight, dbias, None, None


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    correction: int = 0,
) -> torch.Tensor:
    """LayerNorm over the last dimension of x, from scratch, with a hand-derived backward.

    x has any shape [..., C]; weight and bias (optional) have shape [C]. correction=0 uses the population
    variance (as nn.LayerNorm); correction=1 the sample variance (as the chapter's LayerNorm1d, x.var(1)).
    Half and bfloat16 inputs are normalized in float32 and returned in their own dtype.

    >>> x = torch.randn(2, 3, 8)
    >>> y = layer_norm(x, torch.ones(8), torch.zeros(8))
    >>> y.shape
    torch.Size([2, 3, 8])
    >>> bool(y.mean(-1).abs().max() < 1e-5)
    True
    """
    _check_args(x, weight, bias, eps)
    C = x.shape[-1]
    if not 0 <= correction < C:
        raise ValueError(f"correction must be in [0, C) = [0, {C}) for C={C} features, got {correction}")
    return _LayerNormFunction.apply(x, weight, bias, float(eps), int(correction))


def layer_norm_naive(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    correction: int = 0,
) -> torch.Tensor:
    """The formula op by op, differentiated by autograd: the baseline the hand-written backward must beat."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).sum(-1, keepdim=True) / (x.shape[-1] - correction)
    y = (x - mean) / torch.sqrt(var + eps) * weight
    return y if bias is None else y + bias


# ----------------------------------------------------------------------------------------------------------------
# 2. Triton (fused kernels). Imported lazily.


class TritonUnavailableError(RuntimeError):
    """The Triton norm was chosen where Triton cannot run."""


_WHAT_TO_DO = (
    "use a machine with a CUDA GPU, or set TRITON_INTERPRET=1 in the environment before starting Python to run the "
    "Triton kernels on the CPU through Triton's (slow) interpreter, or choose another norm such as 'builtin' or "
    "'custom'"
)


def _require_triton() -> None:
    """Raise TritonUnavailableError, saying why and what to do, when triton cannot be imported."""
    try:
        import triton  # noqa: F401
    except ImportError as e:
        raise TritonUnavailableError(
            f"norm 'triton' needs the triton package, which cannot be imported here ({e}); triton ships for "
            f"Linux only (not macOS or Windows). To fix: pip install triton on Linux, or {_WHAT_TO_DO}"
        ) from None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def check_triton_device(device: torch.device | str) -> None:
    """The kernels run on a CUDA GPU, or on CPU tensors through the interpreter: anything else gets told why.

    Called on every Triton forward and backward; scripts call it too, to refuse before loading a model.
    """
    device = torch.device(device)
    interpret = _KERNELS.get("interpret", _interpreting())  # once defined, the kernels' own mode decides
    if device.type == "cuda" or (device.type == "cpu" and interpret):
        return
    setting = repr(os.environ["TRITON_INTERPRET"]) if "TRITON_INTERPRET" in os.environ else "unset"
    if device.type == "cpu" and _interpreting():
        setting = "'1', but only after this process had compiled the kernels for a GPU"
    raise TritonUnavailableError(
        f"norm 'triton' cannot run on device {device}: its kernels run on a CUDA GPU, or on the CPU only "
        f"through Triton's interpreter (TRITON_INTERPRET=1; here it is {setting}). To fix: move the model and "
        f"data to a CUDA device, or {_WHAT_TO_DO}"
    )


_KERNELS: dict[str, object] = {}


# Triton and its language module are imported on first use (the kernels are defined then), not with this file.
triton = tl = None


def _import_triton() -> None:
    global triton, tl
    _require_triton()
    import triton
    import triton.language as tl


_MAX_BLOCK = 8192  # widest block (columns) one program holds in registers; wider rows loop over blocks


def _block_size(C: int, max_block: int) -> tuple[int, bool]:
    """(BLOCK_SIZE, ONE_BLOCK): a power of two >= C when the row fits one block, else max_block."""
    block = min(triton.next_power_of_2(C), max_block)
    return block, C <= block


def _num_warps(block: int) -> int:
    """Warps per program: one per 256 columns (8 per thread), at most 8, or 16 for the widest blocks."""
    return min(max(block // 256, 1), 8 if block < 8192 else 16)


def _kernel(name: str):
    """The jitted kernel `name`, defining it (and importing triton) the first time."""
    if name not in _KERNELS:
        _import_triton()
        _KERNELS["interpret"] = _interpreting()  # triton.jit picks interpreter or compiler now, at definition
        _KERNELS["fwd"] = _define_forward_kernel()
        _KERNELS["bwd"] = _define_backward_kernel()
    return _KERNELS[name]


# Forward kernel: one program normalizes one row. Same arithmetic as `layer_norm` above, in float32 registers:
# shift by x_0, two passes (sum, then sum of squares of the centred row), then y = xc * rstd * w + b.
# It saves rstd and mean_s, the mean of x - x_0 (not of x): the backward re-reads x_0 and centres the row exactly
# as the forward did. (A float32 mean of a row at 1e4 is off by up to 5e-4, which x - mean would inherit.)
# When the row fits in one block it is loaded once and stays in registers; a wider row is read in blocks of
# BLOCK_SIZE columns, once per pass (the re-reads come from cache).


def _define_forward_kernel():
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

    return layer_norm_fwd_kernel


def _triton_forward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, max_block: int = _MAX_BLOCK
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the forward kernel: (y like x; mean_s = mean of x - x_0, and rstd: float32 [*x.shape[:-1]])."""
    check_triton_device(x.device)
    kernel = _kernel("fwd")
    C = x.shape[-1]
    x2 = x.reshape(-1, C)  # rows may keep a stride; columns must be contiguous
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    N = x2.shape[0]
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    mean_s = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    rstd = torch.empty_like(mean_s)
    if N == 0:
        return y, mean_s, rstd
    block, one_block = _block_size(C, max_block)
    w = weight.contiguous()
    b = bias.contiguous() if bias is not None else w  # placeholder pointer, never read when HAS_BIAS=False
    kernel[(N,)](
        x2, y, w, b, mean_s, rstd, x2.stride(0), C, C, eps,
        HAS_BIAS=bias is not None, BLOCK_SIZE=block, ONE_BLOCK=one_block, num_warps=_num_warps(block),
    )
    return y, mean_s, rstd


# Backward kernel. Program p takes a contiguous group of rows. For each row it recomputes the forward's
# xhat = (x - x_0 - mean_s) * rstd, forms g = dy * w, and writes (derivation above, at `_LayerNormFunction`)
#     dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
# while it adds dy * xhat and dy into its own float32 partial sums of dw and db: row p of a [programs, C] buffer.
# The launcher then sums the buffer over programs: deterministic, no atomics, no locks.


def _define_backward_kernel():
    @triton.jit
    def layer_norm_bwd_kernel(
        DY, X, W, MeanS, Rstd, DX, DW, DB,  # DY, X, DX [N, C] (row strides below); DW, DB [programs, C] float32
        stride_dy, stride_x, stride_dx, N, C, rows_per_program,
        BLOCK_SIZE: tl.constexpr, ONE_BLOCK: tl.constexpr,
    ):
        pid = tl.program_id(0).to(tl.int64)  # 64-bit, and so are the row indices below
        row_start = pid * rows_per_program
        row_end = tl.minimum(row_start + rows_per_program, N)
        DW += pid * C  # this program's own row of the partial-sum buffers
        DB += pid * C
        if ONE_BLOCK:
            cols = tl.arange(0, BLOCK_SIZE)
            mask = cols < C
            w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
            dw = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
            db = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
            for r in range(row_start, row_end):
                x = tl.load(X + r * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(DY + r * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
                shift = tl.load(X + r * stride_x).to(tl.float32)  # x_0, the forward's shift
                rstd = tl.load(Rstd + r)
                xhat = tl.where(mask, (x - shift - tl.load(MeanS + r)) * rstd, 0.0)
                g = dy * w  # zero in the padding columns, since dy and w are
                mean_gx = tl.sum(g * xhat, axis=0) / C
                mean_g = tl.sum(g, axis=0) / C
                dx = (g - mean_g - xhat * mean_gx) * rstd
                tl.store(DX + r * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
                dw += dy * xhat
                db += dy
            tl.store(DW + cols, dw, mask=mask)
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
                    tl.store(DB + cols, tl.load(DB + cols, mask=mask) + dy, mask=mask)
                tl.debug_barrier()  # this row's updates of DW/DB are visible to every thread before the next

    return layer_norm_bwd_kernel


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _num_programs(N: int, num_warps: int, device: torch.device) -> int:
    if device.type == "cuda":  # about 32 warps per SM: enough rows in flight, a small partial-sum buffer
        index = device.index if device.index is not None else torch.cuda.current_device()
        return min(N, _sm_count(index) * max(4, 32 // num_warps))
    return min(N, 4)  # the interpreter runs programs one after another: fewer is faster


def _triton_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    mean_s: torch.Tensor,
    rstd: torch.Tensor,
    max_block: int = _MAX_BLOCK,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward kernel: (dx like x, dweight like weight, dbias like weight)."""
    check_triton_device(x.device)
    kernel = _kernel("bwd")
    C = x.shape[-1]
    x2, dy2 = x.reshape(-1, C), dy.reshape(-1, C)  # an expanded dy (stride 0) is copied here by reshape
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    dy2 = dy2 if dy2.stride(-1) == 1 and dy2.stride(0) != 0 else dy2.contiguous()
    N = x2.shape[0]
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    block, one_block = _block_size(C, max_block)
    programs = _num_programs(N, _num_warps(block), x.device)
    # one-block programs write their whole row of partial sums; the looped path adds into it, so starts from 0
    new = torch.empty if one_block and N > 0 else torch.zeros
    dw_partial = new((max(programs, 1), C), dtype=torch.float32, device=x.device)
    db_partial = new((max(programs, 1), C), dtype=torch.float32, device=x.device)
    if N > 0:
        kernel[(programs,)](
            dy2, x2, weight.contiguous(), mean_s.reshape(-1), rstd.reshape(-1), dx, dw_partial, db_partial,
            dy2.stride(0), x2.stride(0), C, N, C, triton.cdiv(N, programs),
            BLOCK_SIZE=block, ONE_BLOCK=one_block, num_warps=_num_warps(block),
        )
    # one deterministic reduction over the programs
    return dx, dw_partial.sum(0).to(weight.dtype), db_partial.sum(0).to(weight.dtype)


# The autograd rule, and torch.compile support: both kernels become torch.library custom ops, so torch.compile
# traces a model through them (with shapes from the fake implementations below) instead of breaking the graph.


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, _eps = inputs
    _y, mean_s, rstd = output
    ctx.save_for_backward(x, weight, mean_s, rstd)
    ctx.has_bias = bias is not None


def _backward_rule(ctx, dy, _dmean=None, _drstd=None):
    x, weight, mean_s, rstd = ctx.saved_tensors
    dx, dw, db = _ops["bwd"](dy, x, weight, mean_s, rstd)
    return dx, dw, db if ctx.has_bias else None, None


def _register_custom_ops() -> dict:
    """Register layernorm::triton_fwd / triton_bwd (or reuse them if this file was imported twice)."""
    try:
        return {"fwd": torch.ops.layernorm.triton_fwd.default, "bwd": torch.ops.layernorm.triton_bwd.default}
    except (AttributeError, RuntimeError):
        pass
    fwd = torch.library.custom_op(
        "layernorm::triton_fwd",
        lambda x, weight, bias, eps: _triton_forward(x, weight, bias, eps),
        mutates_args=(),
        schema="(Tensor x, Tensor weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)",
    )
    bwd = torch.library.custom_op(
        "layernorm::triton_bwd",
        lambda dy, x, weight, mean_s, rstd: _triton_backward(dy, x, weight, mean_s, rstd),
        mutates_args=(),
        schema="(Tensor dy, Tensor x, Tensor weight, Tensor mean_s, Tensor rstd) -> (Tensor, Tensor, Tensor)",
    )

    @fwd.register_fake
    def _(x, weight, bias, eps):
        stats = x.new_empty(x.shape[:-1], dtype=torch.float32)
        return x.new_empty(x.shape), stats, torch.empty_like(stats)

    @bwd.register_fake
    def _(dy, x, weight, mean_s, rstd):
        return x.new_empty(x.shape), weight.new_empty(weight.shape), weight.new_empty(weight.shape)

    fwd.register_autograd(_backward_rule, setup_context=_setup_context)
    return {"fwd": fwd, "bwd": bwd}


class _TritonFunction(torch.autograd.Function):
    """The same autograd rule, for a torch without torch.library.custom_op (before 2.4): no torch.compile."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, mean_s, rstd = _triton_forward(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean_s, rstd)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        return _backward_rule(ctx, dy)


if hasattr(torch.library, "custom_op"):
    _ops = _register_custom_ops()
else:  # pragma: no cover (old torch)
    _ops = {"fwd": None, "bwd": _triton_backward}


def layer_norm_triton(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-5
) -> torch.Tensor:
    """LayerNorm over the last dimension of x (any shape [..., C]) with the fused Triton kernels.

    Same function and gradients as `layer_norm` (population variance). Runs on CUDA tensors, or on CPU tensors
    when TRITON_INTERPRET=1 was set before triton was imported.
    """
    _check_args(x, weight, bias, eps)
    check_triton_device(x.device)
    if _ops["fwd"] is None:  # pragma: no cover (old torch)
        return _TritonFunction.apply(x, weight, bias, float(eps))
    return _ops["fwd"](x, weight, bias, float(eps))[0]


# ----------------------------------------------------------------------------------------------------------------
# 3. Modules and the registry. The three LayerNorms share one parameter layout: `weight` [dim] and `bias` [dim]
# (or None), so a state_dict saved with one loads into any other.


def _init_affine(module: nn.Module, dim: int, bias: bool, eps: float) -> None:
    """The parameter layout every norm here shares: weight [dim] (ones), bias [dim] (zeros) or None."""
    if isinstance(dim, bool) or not (isinstance(dim, int) and dim >= 1):
        raise ValueError(f"dim must be a positive int (the number of features), got {dim!r}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    module.dim, module.eps = dim, float(eps)
    module.weight = nn.Parameter(torch.ones(dim))
    module.bias = nn.Parameter(torch.zeros(dim)) if bias else None


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension, from scratch (`layer_norm`). The base of the three LayerNorms."""

    def __init__(self, dim: int, *, bias: bool = True, eps: float = 1e-5) -> None:
        super().__init__()
        _init_affine(self, dim, bias, eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, bias={self.bias is not None}, eps={self.eps}"

    def _check_input(self, x: torch.Tensor) -> None:
        if x.dim() == 0 or x.shape[-1] != self.dim:
            raise ValueError(
                f"{type(self).__name__}({self.dim}) expects an input whose last dimension is {self.dim}, "
                f"got shape {tuple(x.shape)}"
            )
        if not x.is_floating_point():
            raise TypeError(f"{type(self).__name__} expects a floating-point input, got {x.dtype}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        return layer_norm(x, self.weight, self.bias, self.eps)


class BuiltinLayerNorm(LayerNorm):
    """PyTorch's own fused kernel, torch.nn.functional.layer_norm, with the same parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        return F.layer_norm(x, (self.dim,), self.weight, self.bias, self.eps)


class TritonLayerNorm(LayerNorm):
    """The fused Triton kernels (`layer_norm_triton`), with the same parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        return layer_norm_triton(x, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019; Gopher, Chinchilla): y = x / sqrt(mean(x^2) + eps) * weight [+ bias].

    No mean subtraction: the row is rescaled to unit root-mean-square, not centred. `bias` is off in those models;
    it is kept optional here for a layout compatible with the LayerNorms. Statistics in float32.
    """

    def __init__(self, dim: int, *, bias: bool = True, eps: float = 1e-5) -> None:
        super().__init__()
        _init_affine(self, dim, bias, eps)

    extra_repr = LayerNorm.extra_repr
    _check_input = LayerNorm._check_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        rms_inv = torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps)
        y = xf * rms_inv * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)


class BatchNorm(nn.Module):
    """BatchNorm over every token of the batch, per feature: the counter-example to LayerNorm.

    For x of shape [..., C], all leading dims are pooled: mean and var of feature c come from every token in the
    batch, so one token's output depends on the others. Training mode normalizes with the batch statistics and
    updates running_mean/running_var (momentum 0.1, unbiased variance, as nn.BatchNorm1d); eval mode uses the
    running statistics, so its output is per token again.

    A training-mode batch of a single token (decoding one token for one user) is computed, not refused: each
    feature's batch mean is the token itself and its (population) variance is 0, so xhat = 0 and the output is
    exactly `bias` (zeros without bias): the token's own information is erased. Such a batch leaves running_mean,
    running_var and num_batches_tracked unchanged, since the unbiased variance of one sample is undefined.
    (nn.BatchNorm1d and F.batch_norm raise on one value per channel in training mode instead.)
    """

    def __init__(self, dim: int, *, bias: bool = True, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__()
        _init_affine(self, dim, bias, eps)
        self.momentum = float(momentum)
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_var", torch.ones(dim))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    extra_repr = LayerNorm.extra_repr
    _check_input = LayerNorm._check_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        x2 = x.reshape(-1, self.dim).to(self.weight.dtype)  # every token of the batch is one sample
        if self.training:
            if x2.shape[0] < 2:
                return self._one_token_batch(x2).to(x.dtype).view(x.shape)
            self.num_batches_tracked.add_(1)
        y = F.batch_norm(
            x2, self.running_mean, self.running_var, self.weight, self.bias, self.training, self.momentum, self.eps
        )
        return y.to(x.dtype).view(x.shape)

    def _one_token_batch(self, x2: torch.Tensor) -> torch.Tensor:
        """Training mode on [N < 2, C]: the ordinary formula with population variance, running stats untouched.

        For one token x - mean is exactly 0 (and var 0), so y == bias (or 0) and the gradient reaching x is 0;
        weight gets 0 and bias the summed upstream gradient, as the formula says. An empty batch gives [0, C].
        """
        mean = x2.mean(dim=0, keepdim=True)
        xc = x2 - mean
        var = (xc * xc).mean(dim=0, keepdim=True)
        y = xc * torch.rsqrt(var + self.eps) * self.weight
        return y if self.bias is None else y + self.bias


_CLASSES: dict[str, type[nn.Module]] = {
    "custom": LayerNorm,
    "builtin": BuiltinLayerNorm,
    "triton": TritonLayerNorm,
    "rmsnorm": RMSNorm,
    "batchnorm": BatchNorm,
}


def make_norm(name: str, dim: int, *, bias: bool = True, eps: float = 1e-5) -> nn.Module:
    """Build the norm called `name` (one of NORMS) over `dim` features.

    custom, builtin and triton are the same LayerNorm (same function, same parameters `weight` and `bias`);
    rmsnorm and batchnorm are the two contrasts. bias=False drops the additive `bias` parameter.
    """
    if name == NO_NORM:
        return nn.Identity()
    if name not in _CLASSES:
        raise ValueError(
            f"unknown norm {name!r}; valid names are {', '.join(NORMS)} (or {NO_NORM!r} for no normalization)"
        )
    if name == "triton":
        _require_triton()
    return _CLASSES[name](dim, bias=bias, eps=eps)

