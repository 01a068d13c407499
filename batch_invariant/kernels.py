"""The batch-invariant mode's Triton kernels, a matrix product for F.linear, attention for
F.scaled_dot_product_attention and a row sum for the norms' sums and means over a row, each beside its launcher
(the package's __init__.py says why each is needed). One rule makes them invariant: a result's order of additions
is fixed by the code, never by the shapes of the call (each kernel's comment says how). They accumulate in float32
(the row sum of float64 in float64) and write the input's dtype. The mode imports this module (and so triton) only
when it meets a CUDA tensor, or is asked for its Triton kernels on CPU tensors. They launch, read
TRITON_INTERPRET and take autocast's dtype as layernorm_triton.py's kernels do.
"""

import torch
import triton
import triton.language as tl

import layernorm_triton
from layernorm_triton import autocast_dtype, launch

INTERPRET = tl.constexpr(layernorm_triton.INTERPRET)  # linear_kernel reads it: a global a kernel reads is a constexpr

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps) per dtype. Fixed, never tuned by shape: a tuner choosing by M would bring
# back the dependence on the batch. BLOCK_M = 16, tl.dot's smallest, wastes least on decoding's 1-8 rows.
LINEAR_TILES = {torch.float32: (16, 64, 32, 4), torch.bfloat16: (16, 64, 64, 4), torch.float16: (16, 64, 64, 4)}
BLOCK_KEYS = 32  # keys per step of attention's walk: any fixed number works; the same for every query
MAX_SUM_BLOCK = 4096  # the row sum's widest block of columns; a wider row is added block after block


# ----------------------------------------------------------------------------------------------------------------
# Linear: program (m, n) computes the output tile rows m*BLOCK_M.., columns n*BLOCK_N.. of y = x @ w.T + b, adding
# K in blocks of BLOCK_K from 0 upwards, each block through one tl.dot of fixed shape. A row's value depends on its
# own x row and on w only: the other rows of its tile go through the same dot, but never into its sums.


@triton.jit(do_not_specialize=["M"])  # M (rows) is what changes between calls: one compiled kernel for every M
def linear_kernel(
    X,
    W,
    Bias,
    Y,  # pointers: x [M, K], w [N, K] (nn.Linear's layout), bias [N], y [M, N]
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # 64-bit indices, so that index * stride cannot wrap past 2**31 elements (the LM head's M * N can reach it)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):  # no split-K: one program adds all of K, in this one order
        ks = k0 + tl.arange(0, BLOCK_K).to(tl.int64)
        x = tl.load(
            X + rows[:, None] * stride_xm + ks[None, :] * stride_xk,
            mask=(rows[:, None] < M) & (ks[None, :] < K),
            other=0.0,
        )
        w = tl.load(
            W + ks[:, None] * stride_wk + cols[None, :] * stride_wn,  # w.T's tile, [BLOCK_K, BLOCK_N]
            mask=(ks[:, None] < K) & (cols[None, :] < N),
            other=0.0,
        )
        if INTERPRET:  # numpy runs the kernel. Its tl.dot is the host BLAS's matmul, which on some CPUs adds a
            # row's products in an order that depends on where the row sits in the tile: the products are summed
            # here instead, in one order for every row (and bfloat16, which numpy lacks, cast exactly to float32)
            acc += tl.sum(x.to(tl.float32)[:, :, None] * w.to(tl.float32)[None, :, :], axis=1)
        else:
            acc = tl.dot(x, w, acc, input_precision="ieee")  # float32 products, not TF32
    if HAS_BIAS:  # added once, after the whole sum: the same for every row
        acc += tl.load(Bias + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    tl.store(
        Y + rows[:, None] * stride_ym + cols[None, :],
        acc.to(Y.dtype.element_ty),
        mask=(rows[:, None] < M) & (cols[None, :] < N),
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear through linear_kernel: x [..., K], weight [N, K], bias [N] -> [..., N] in x's dtype."""
    x, weight, bias = (None if t is None else t.to(autocast_dtype(t)) for t in (x, weight, bias))
    if x.dtype not in LINEAR_TILES or weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        got = f"x {x.dtype}, weight {weight.dtype}" + (f", bias {bias.dtype}" if bias is not None else "")
        raise ValueError(
            f"batch_invariant() linear takes {', '.join(map(str, LINEAR_TILES))} inputs of one dtype, got {got}"
        )
    x2 = x.reshape(-1, x.size(-1))  # a view where it can be; strides are read as they are
    M, K = x2.shape
    N = weight.size(0)
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    block_m, block_n, block_k, warps = LINEAR_TILES[x.dtype]
    bias_arg = weight if bias is None else bias.contiguous()  # a placeholder pointer, never read without a bias
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    args = (x2, weight, bias_arg, y, M, N, K, *x2.stride(), *weight.stride(), y.stride(0))
    if M:
        launch(linear_kernel, grid, (*args, bias is not None, block_m, block_n, block_k), num_warps=warps)
    return y.view(*x.shape[:-1], N)


# ----------------------------------------------------------------------------------------------------------------
# Attention: program (b * H + h) * T + i computes query i of batch row b, head h (one grid dimension: CUDA allows
# 2**31 - 1 programs there, 65,535 in the others). It sees keys 0..n-1, n = min(offset +
# i + 1, S): offset 0 is a causal pass, offset S - T a cached prefix followed by T new queries, offset S - 1 a
# query that sees every key. It walks them BLOCK_KEYS at a time (an online softmax), keeping the running maximum m,
# the running sum total of exp(score - m) and the weighted sum of values acc, each block rescaling them to its m.


# One compiled kernel for every call: the lengths change every decoding step, and the strides and pointers differ
# between a full pass (views of the [B, T, 3C] projection) and a cached step (the cache's buffer). Specialized on
# divisibility by 16 or on alignment, a cached step could compile to another layout, and add in another order.
@triton.jit(
    do_not_specialize="H T S D sqb sqh sqt skb skh sks svb svh svs sob soh sot".split(),  # every integer
    do_not_specialize_on_alignment=["Q", "K", "V", "Out", "First", "End"],
)
def attention_kernel(
    Q,
    K,
    V,
    Out,  # pointers: q, out [B, H, T, D]; k, v [B, H, S, D]; each read through its strides (last one 1)
    H,
    T,
    S,
    D,
    First,  # [B, T] int64: query i of row b sees keys First[b, i] .. End[b, i] - 1
    End,
    scale,
    sqb,
    sqh,
    sqt,
    skb,
    skh,
    sks,
    svb,
    svh,
    svs,
    sob,
    soh,
    sot,
    BLOCK_KEYS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)  # 64-bit indices: b * sqb cannot wrap once B * T * 3C passes 2**31
    i = pid % T
    b = pid // T // H
    h = pid // T % H
    d = tl.arange(0, BLOCK_D)
    q = tl.load(Q + b * sqb + h * sqh + i * sqt + d, mask=d < D, other=0.0).to(tl.float32) * scale
    K += b * skb + h * skh
    V += b * svb + h * svh
    # the keys this query sees: the same run alone, in a batch, left padded, cached or not
    first = tl.load(First + b * T + i)
    n = tl.load(End + b * T + i)
    m = tl.full([], float("-inf"), tl.float32)
    total = tl.zeros([], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for start in range(first, n, BLOCK_KEYS):  # from the first key, in fixed blocks: only the run decides the order
        keys = start + tl.arange(0, BLOCK_KEYS)
        seen = keys < n
        tile = seen[:, None] & (d[None, :] < D)
        k = tl.load(K + keys[:, None] * sks + d[None, :], mask=tile, other=0.0).to(tl.float32)
        scores = tl.where(seen, tl.sum(k * q[None, :], axis=1), float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=0))
        rescale = tl.exp(m - m_new)  # 0 on the first block (m = -inf)
        p = tl.exp(scores - m_new)
        v = tl.load(V + keys[:, None] * svs + d[None, :], mask=tile, other=0.0).to(tl.float32)
        total = total * rescale + tl.sum(p, axis=0)
        acc = acc * rescale + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    tl.store(Out + b * sob + h * soh + i * sot + d, (acc / total).to(Out.dtype.element_ty), mask=d < D)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: torch.Tensor, end: torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention for q [B, H, T, D] over k, v [B, H, S, D], query i of row b over keys first[b, i] .. end[b, i] - 1
    (batch_invariant.visible_keys)."""
    S = k.size(2)
    q, k, v = (t.to(autocast_dtype(t)) for t in (q, k, v))
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"batch_invariant() attention takes q, k, v of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))  # features side by side
    B, H, T, D = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3])
    first, end = (t.to(q.device, torch.int64).contiguous() for t in (first, end))
    args = (q, k, v, out, H, T, S, D, first, end, scale, *strides, BLOCK_KEYS, triton.next_power_of_2(D))
    if out.numel():
        launch(attention_kernel, (B * H * T,), args)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Row sum: program r adds row r's C values, BLOCK columns at a time from column 0 upwards, into BLOCK running
# totals, and then adds those in one tl.sum. The order depends on C alone (BLOCK is chosen from C), never on how many
# rows came: stock CUDA reductions choose their block width by the number of rows too.


@triton.jit(do_not_specialize=["C"], do_not_specialize_on_alignment=["X", "Out"])
def row_sum_kernel(X, Out, C, BLOCK: tl.constexpr):  # X [N, C] contiguous, Out [N] (its dtype accumulates)
    row = tl.program_id(0).to(tl.int64)
    total = tl.zeros([BLOCK], dtype=Out.dtype.element_ty)
    for start in range(0, C, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        total += tl.load(X + row * C + cols, mask=cols < C, other=0.0).to(Out.dtype.element_ty)
    tl.store(Out + row, tl.sum(total, axis=0))


def row_sum(x: torch.Tensor) -> torch.Tensor:
    """x [..., C] -> [...]: each row's sum through row_sum_kernel, in x's dtype."""
    C = x.size(-1)
    rows = x.reshape(-1, C).contiguous()
    sums = torch.zeros(len(rows), dtype=torch.promote_types(x.dtype, torch.float32), device=x.device)
    if sums.numel() and C:
        launch(row_sum_kernel, (len(rows),), (rows, sums, C, min(triton.next_power_of_2(C), MAX_SUM_BLOCK)))
    return sums.to(x.dtype).view(x.shape[:-1])
