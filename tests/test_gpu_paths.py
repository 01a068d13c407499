"""The paths that run only on a CUDA GPU, exercised on the CPU through the Triton and torch objects they call: the
triton_op traced with symbolic shapes and functionalized as torch.compile does, the backward kernel compiled for
GPU targets by Triton's own compiler (shared memory), and the attention kernel's arguments specialized by Triton's
own binder. Where a check needs Triton to compile rather than interpret, it runs in a fresh Python without
TRITON_INTERPRET, as on a GPU machine (nothing is launched). (What the --cuda_graphs capture is handed, through
torch's own make_graphed_callables: test_train.py.)"""

import json

import pytest

from helpers import TRITON_SKIP, python

if TRITON_SKIP is not None:
    pytest.skip(TRITON_SKIP, allow_module_level=True)


PRELUDE = """\
import json, operator, torch, triton
RESULTS = {}
from torch.fx.experimental.proxy_tensor import make_fx
from torch._subclasses.functional_tensor import dispatch_functionalize
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

def launches(module, name):
    '''Replace module.<name> (a jitted kernel) by a recorder of what its launcher passes: (grid, args, kwargs).'''
    calls = []
    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((grid, args, kwargs))
    kernel = getattr(module, name)
    setattr(module, name, Recorder())
    return kernel, calls

def specialize(kernel, args, kwargs, arch):
    '''Triton's own binder for a CUDA target: what JITFunction.run keys its compiled kernels by.'''
    binder = create_function_from_signature(kernel.signature, kernel.params, make_backend(GPUTarget("cuda", arch, 32)))
    return binder(*args, **kwargs)

def compile_for(kernel, args, kwargs, arch):
    '''Compile as JITFunction.run would on that GPU: its binder, _pack_args, ASTSource, triton.compile.'''
    backend = make_backend(GPUTarget("cuda", arch, 32))
    bound, specialization, opts = specialize(kernel, args, kwargs, arch)
    opts, signature, constexprs, attrs = kernel._pack_args(backend, opts, bound, specialization, opts)
    src = ASTSource(kernel, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=opts.__dict__)
"""

# ---- layernorm_triton's triton_op (TRITON_OP: any CUDA machine), as torch.compile traces it ----

TRACE = """\
import layernorm_triton as lt
assert lt.TRITON_OP and not lt.INTERPRET
WRAPPER = torch.ops.higher_order.triton_kernel_wrapper_functional

def trace(fn, args, mode):
    try:
        return make_fx(dispatch_functionalize(fn), tracing_mode=mode)(*args), None
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"[:300]

def report(graph, output):
    '''For each kernel call, the arguments that share one tensor; and which kernel outputs `output` is made of.'''
    calls = [n for n in graph.graph.nodes if n.target is WRAPPER]
    shared = []
    for call in calls:
        tensors = [(k, v) for k, v in call.kwargs["kwargs"].items() if isinstance(v, torch.fx.Node)
                   and isinstance(v.meta.get("val"), torch.Tensor)]
        shared += [[a, b] for i, (a, na) in enumerate(tensors) for b, nb in tensors[i + 1:] if na is nb]
    seen, todo, keys = set(), [list(graph.graph.nodes)[-1].args[0][output]], set()
    while todo:
        node = todo.pop()
        if node in seen or not isinstance(node, torch.fx.Node):
            continue
        seen.add(node)
        if node.target is operator.getitem and node.args[0] in calls:
            keys.add(node.args[1])
        todo += [a for a in node.args if isinstance(a, torch.fx.Node)]
    return {"shared": shared, "from": sorted(keys)}

out = {}
for N in (6, lt.ONE_PROGRAM_ROWS + 8):  # one backward program, and partial sums
    x, dy, w, b = torch.randn(N, 16), torch.randn(N, 16), torch.randn(16), torch.randn(16)
    stats = torch.rand(2, N)  # (fake tensors: no kernel runs)
    for has_bias in (False, True):
        fwd = lambda x, w, b: torch.ops.layernorm.triton_fwd(x, w, b, 1e-5, torch.float32)
        bwd = lambda dy, x, w, s: torch.ops.layernorm.triton_bwd(dy, x, w, s, has_bias)
        for mode in ("fake", "symbolic"):
            g, error = trace(fwd, (x, w, b if has_bias else None), mode)
            out[f"fwd N={N} bias={has_bias} {mode}"] = error or report(g, 0)
            g, error = trace(bwd, (dy, x, w, stats), mode)
            out[f"bwd N={N} bias={has_bias} {mode}"] = error or report(g, 1)
RESULTS["trace"] = out
"""


# ---- The backward kernel compiled for GPUs by Triton's compiler: its shared memory fits the GPU it would run on ----

SHARED_MEMORY = """\
import layernorm_triton as lt
GPUS = {"sm_86 (RTX 30)": (86, 101376), "sm_90 (H100)": (90, 232448)}  # max shared memory per block, bytes
out = {}
for name, (arch, limit) in GPUS.items():
    lt._shared_memory = lambda device, limit=limit: limit
    for dtype in (torch.float64, torch.float32):
        kernel, calls = launches(lt, "layer_norm_bwd_kernel")
        lt.launch = lambda k, grid, args, traced=False, **options: calls.append((grid, args, options))
        x = torch.randn(2, 8192, dtype=dtype)
        lt._backward(x, x, torch.ones(8192, dtype=dtype), torch.ones(2, 2, dtype=dtype))
        (_, args, kwargs), = calls
        compiled = compile_for(kernel, args, kwargs, arch)
        out[f"{name} {dtype}"] = {"shared": compiled.metadata.shared, "limit": limit, "stages": args[-1]}
        lt.layer_norm_bwd_kernel = kernel
RESULTS["shared memory"] = out
"""


# ---- The batch-invariant attention kernel: one compiled kernel for a full pass and for a cached step ----

SPECIALIZATION = """\
from batch_invariant import kernels as bit
B, H, D, T = 2, 3, 12, 5  # head size 12 and 3C = 108: strides not multiples of 16
kernel, calls = launches(bit, "attention_kernel")
qkv = torch.randn(B, T, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)  # as model.py splits c_attn's output
cache = torch.randn(2, B, H, 8, D)  # model.KVCache's buffers, [B, H, block_size, D]
first, end = torch.zeros(B, T, dtype=torch.long), torch.arange(1, T + 1).expand(B, T)
bit.attention(*qkv, first, end, scale=0.3)  # a full causal pass
step = torch.randn(B, 1, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)
first, end = torch.zeros(B, 1, dtype=torch.long), torch.full((B, 1), 6)
bit.attention(step[0], cache[0][:, :, :6], cache[1][:, :, :6], first, end, scale=0.3)  # a cached step
RESULTS["specialization"] = [repr(specialize(kernel, args, kwargs, 90)[1]) for _, args, kwargs in calls]
bit.attention_kernel = kernel
"""


OFFSETS = """\
import re
from batch_invariant import kernels as bit
calls_by_case = {
    "linear": ("linear_kernel", lambda: bit.linear(torch.randn(5, 40), torch.randn(24, 40), torch.randn(24))),
    "linear, x transposed": ("linear_kernel", lambda: bit.linear(torch.randn(40, 5).T, torch.randn(24, 40))),
    "attention": (
        "attention_kernel",
        lambda: bit.attention(
            *torch.randn(3, 2, 3, 5, 12), torch.zeros(2, 5, dtype=torch.long), torch.arange(1, 6).expand(2, 5), 0.3
        ),
    ),
}
products = {}
for case, (name, call) in calls_by_case.items():
    kernel, calls = launches(bit, name)
    call()
    setattr(bit, name, kernel)
    (_, args, kwargs), = calls
    products[case] = re.findall(r"arith\\.muli [^:]*: (\\S+)", compile_for(kernel, args, kwargs, 90).asm["ttir"])
RESULTS["offsets"] = products
"""


@pytest.mark.slow  # a fresh interpreter compiles
def test_the_gpu_only_paths_trace_and_compile_as_on_a_gpu():
    """The four scripts above in one fresh Python, where Triton compiles for a GPU (no TRITON_INTERPRET), each
    printing its results into one JSON line, checked for all they say:
    - torch.compile(dynamic=True), and opcheck's dynamic-shape check, trace the launchers with symbolic sizes: the
      launch parameters' cache must be keyed by plain ints (a SymInt is unhashable);
    - functionalized (as torch.compile's AOT pass does), every tensor a kernel gets may be taken as written and
      cloned: without a bias, the unused pointer must be a tensor of its own, or dw comes back as an unwritten clone;
    - the one-block backward's pipelined row loop keeps a block of x and one of dy in shared memory: 128 KiB for a
      float64 row of 8192, more than an RTX 30's 99 KiB, where the loop must not be pipelined; float32 (64 KiB) is,
      and on an H100 both are;
    - Triton keys its compiled kernels by each argument's specialization (an integer divisible by 16, a pointer
      16-byte aligned); a full pass and a cached step with head size 12 differ in both, and must get one kernel;
    - every product in the matrix product's and the attention's TTIR (an index times a stride) is 64-bit: in 32 bits
      rows * stride_ym wraps once M * N reaches 2**31 (the LM head at vocabulary 50,304 over 42,692 rows), and the
      attention's b * sqb once B * T * 3C does."""
    code = PRELUDE + TRACE + SHARED_MEMORY + SPECIALIZATION + OFFSETS + "print(json.dumps(RESULTS))\n"
    proc = python("-c", code, timeout=600, drop=("TRITON_INTERPRET",))  # Triton compiles for a GPU: no interpreter
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    traced = results["trace"]
    errors = {case: r for case, r in traced.items() if "symbolic" in case and isinstance(r, str)}
    assert not errors, errors
    for case, r in traced.items():
        if "fake" in case:
            assert r["shared"] == [], (case, r)
            if "bias=False" in case:  # (with a bias, dw and db are two slices of one buffer, both written)
                assert r["from"] == (["Y"] if case.startswith("fwd") else ["DW"]), (case, r)
    shared = results["shared memory"]
    for case, r in shared.items():
        assert r["shared"] <= r["limit"], (case, r)
    assert shared["sm_86 (RTX 30) torch.float32"]["stages"] == 2 and shared["sm_90 (H100) torch.float64"]["stages"] == 2
    full_pass, cached_step = results["specialization"]
    assert full_pass == cached_step
    for case, types in results["offsets"].items():
        assert types, case  # (the kernel has index * stride products, read here)
        assert all(t == "i64" or t.endswith("xi64>") for t in types), (case, types)
