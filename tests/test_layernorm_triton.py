"""The Triton LayerNorm beyond the shared tests: wide rows, determinism, torch.compile, and the errors that say
why Triton cannot run; at sizes Triton's interpreter (conftest.py) runs quickly."""

import contextlib
import shutil
from pathlib import Path

import pytest
import torch

import layernorm
from helpers import (
    DEVICE,
    ROOT,
    TRITON_SKIP,
    assert_matches_reference,
    forward_backward,
    layer_norm_reference,
    make_inputs,
    python,
    rel_err,
)
from layernorm import TritonUnavailableError, check_triton_device, make_norm

if TRITON_SKIP is not None:
    pytest.skip(TRITON_SKIP, allow_module_level=True)
import layernorm_triton as lt  # after the skip: triton is there


@pytest.mark.parametrize(
    "C, max_block, N, dtype, tol",
    [
        (100, 32, 5, torch.float32, 1e-5),
        (64, 32, 5, torch.float32, 1e-5),
        (33, 16, 5, torch.float32, 1e-5),
        (7, 4, 5, torch.float32, 1e-5),
        (33, 16, 40, torch.float32, 1e-5),
        (100, 32, 3, torch.bfloat16, 2e-2),
    ],
)
def test_rows_wider_than_one_block_loop_over_blocks(C, max_block, N, dtype, tol):
    """Force the looped path with a small block: every column still counts, forward and backward, with one
    backward program and with several (each clears its own partial sums first); in bfloat16, statistics in float32."""
    x, w, b, dy = make_inputs((N,), C, dtype=dtype)
    y, stats = lt._forward(x, w, b, 1e-5, max_block=max_block)
    assert stats.dtype == torch.float32 and stats.shape == (2, N)
    dx, dw, db = lt._backward(dy, x, w, stats, max_block=max_block)
    for out, ref in zip((y, dx, dw, db), layer_norm_reference(x, w, b, dy), strict=True):
        assert out.dtype == dtype and rel_err(out, ref) <= tol


def test_feature_size_beyond_65536():
    assert_matches_reference("triton", *make_inputs((2,), 65537))


@pytest.mark.slow  # many launches through Triton's interpreter
def test_float64_is_computed_in_float64():
    """A float64 input keeps float64 arithmetic (statistics and partial sums included): within 1e-12 of the
    reference (its gradients: autograd through the formula in float64), where float32 arithmetic is 1e-7 away."""
    x, w, b, dy = make_inputs((lt.ONE_PROGRAM_ROWS + 3,), 24, dtype=torch.float64)  # several backward programs
    y, grads = forward_backward("triton", x, w, b, dy)
    for out, ref in zip((y, *grads), layer_norm_reference(x, w, b, dy), strict=True):
        assert out.dtype == torch.float64 and rel_err(out, ref) <= 1e-12


# One rounding of the float32 result: half a unit in the last place, or a whole one for bfloat16 in the
# interpreter, whose float32-to-bfloat16 store truncates (compiled kernels round to nearest).
BF16_TOL = 2**-7 if lt.INTERPRET else 2**-8


@pytest.mark.parametrize("dtype, tol", [(torch.bfloat16, BF16_TOL), (torch.float16, 2**-11)])
def test_autocast_writes_the_output_in_the_autocast_dtype(dtype, tol):
    """Under autocast, where only a Linear reads y (feeds_linear), y comes in the autocast dtype (what that Linear
    casts to), rounded once from float32 arithmetic: within that rounding of the float64 reference. Gradients keep
    the parameters' float32. Anywhere else (a post-norm residual stream) y keeps x's dtype."""
    x, w, b, dy = make_inputs((6,), 48)
    xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
    with torch.autocast(DEVICE, dtype=dtype):
        y = lt.layer_norm_triton(xr, wr, br, feeds_linear=True)
        assert lt.layer_norm_triton(xr, wr, br).dtype == torch.float32  # (the module's feeds_linear: test_model.py)
    assert y.dtype == dtype
    grads = torch.autograd.grad(y, (xr, wr, br), dy.to(dtype))
    y_ref, *grads_ref = layer_norm_reference(x, w, b, dy.to(dtype))
    assert rel_err(y, y_ref) <= tol
    for g, g_ref in zip(grads, grads_ref, strict=True):
        assert g.dtype == torch.float32
        assert rel_err(g, g_ref) <= 1e-5
    with torch.autocast(DEVICE, dtype=dtype):
        assert lt.layer_norm_triton(x.double(), w, b, feeds_linear=True).dtype == torch.float64  # float64 left alone


@pytest.mark.parametrize("norm, function", [("triton", lt._LayerNormTriton), ("custom", layernorm._LayerNormFunction)])
def test_no_autograd_function_when_no_gradient_is_wanted(norm, function, monkeypatch):
    """Under no_grad, or with nothing requiring grad (decoding, evaluation), the forward is called directly: no
    autograd Function to set up. The same values as through the Function (with a gradient wanted, the Function:
    its backward node, test_layernorm.py's OWN_BACKWARD)."""
    module = make_norm(norm, 16).to(DEVICE)
    x = make_inputs((3,), 16)[0]
    with_function = module(x)
    monkeypatch.setattr(function, "apply", lambda *args: pytest.fail("autograd.Function.apply was called"))
    with torch.no_grad():
        assert torch.equal(module(x), with_function)
    module.requires_grad_(False)
    assert torch.equal(module(x), with_function)


@pytest.mark.parametrize("N", [9, lt.ONE_PROGRAM_ROWS + 9], ids=["one program", "partial sums"])
@pytest.mark.parametrize("stages", [2, 1], ids=["pipelined", "plain loop"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_backward_with_and_without_the_pipelined_row_loop(N, stages, with_bias, monkeypatch):
    """Both row loops (pipelined, and plain where the pipeline's buffer would not fit the GPU), with and without a
    bias (no dbias sums then), one program writing the sums or several their partial sums: float64's gradients. To
    the bit the same from a second call (the partial sums are reduced in a fixed order), and under torch.compile
    (traced=True), whose dweight and dbias come from two reductions instead of one."""
    monkeypatch.setattr(lt, "_num_stages", lambda block, x, dy: stages)
    x, w, b, dy = make_inputs((N,), 24)
    assert (lt._backward_programs(N, x.device) > 1) == (N > lt.ONE_PROGRAM_ROWS)
    y, stats = lt._forward(x, w, b if with_bias else None, 1e-5)
    dx, dw, db = lt._backward(dy, x, w, stats, has_bias=with_bias)
    for traced in (False, True):
        again = lt._backward(dy, x, w, stats, has_bias=with_bias, traced=traced)
        torch.testing.assert_close(again, (dx, dw, db), rtol=0, atol=0)
    _, dx_ref, dw_ref, db_ref = layer_norm_reference(x, w, b if with_bias else torch.zeros_like(b), dy)
    assert rel_err(dx, dx_ref) <= 1e-5
    assert rel_err(dw, dw_ref) <= 1e-5
    if with_bias:
        assert rel_err(db, db_ref) <= 1e-5
    else:
        assert db is None


def test_launches_are_made_under_the_tensors_own_device(monkeypatch):
    """Triton launches on the current CUDA device's stream, so a launch for tensors on cuda:1 makes cuda:1 current
    (a model there must not launch on cuda:0), and switches nothing when it already is. Checked without a GPU."""
    current, switches, launched_on = [0], [], []

    @contextlib.contextmanager
    def switch(index):
        switches.append(index)
        before, current[0] = current[0], index
        yield
        current[0] = before

    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(torch.cuda, "device", switch)
    on_cuda1 = type("Tensor", (), {"device": torch.device("cuda", 1), "is_cuda": True})()
    kernel = {(4,): lambda *args, num_warps: launched_on.append(current[0])}  # kernel[grid](*args), as a jitted one
    lt.launch(kernel, (4,), (on_cuda1,), num_warps=1)
    assert switches == [1] and launched_on == [1] and current == [0]
    current[0] = 1
    lt.launch(kernel, (4,), (on_cuda1,), num_warps=1)
    assert switches == [1] and launched_on == [1, 1]  # already current: no switch


@pytest.mark.slow  # many launches through Triton's interpreter
def test_custom_ops_pass_opcheck():
    """Schema, fake (meta) implementations and autograd registration agree with the real kernels."""
    x, w, b, dy = make_inputs((3,), 16)
    x.requires_grad_(), w.requires_grad_(), b.requires_grad_()
    for out_dtype in (torch.float32, torch.bfloat16):
        torch.library.opcheck(torch.ops.layernorm.triton_fwd.default, (x, w, b, 1e-5, out_dtype))
    torch.library.opcheck(torch.ops.layernorm.triton_fwd.default, (x, w, None, 1e-5, torch.float32))
    _, stats = lt._forward(x.detach(), w.detach(), b.detach(), 1e-5)
    for has_bias in (True, False):
        args = (dy, x.detach(), w.detach(), stats, has_bias)
        torch.library.opcheck(torch.ops.layernorm.triton_bwd.default, args)


@pytest.mark.slow  # torch.compile traces a whole model
@pytest.mark.parametrize("norm", ["triton", "custom"])
def test_torch_compile_traces_a_model_with_the_norm(norm):
    """fullgraph=True: the norm must not break the graph. aot_eager traces forward and backward (no C compiler);
    the Triton norm goes through its torch.library custom ops there."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 16), make_norm(norm, 16), torch.nn.Linear(16, 4)).to(DEVICE)
    compiled = torch.compile(net, backend="aot_eager", fullgraph=True)
    x = torch.randn(3, 5, 16, device=DEVICE)
    out, ref = compiled(x), net(x)
    torch.testing.assert_close(out, ref)
    grads = torch.autograd.grad(out.square().sum(), list(net.parameters()))
    torch.testing.assert_close(grads, torch.autograd.grad(ref.square().sum(), list(net.parameters())))


# ---- Where Triton cannot run, the error says why and what to do ----


COPIED_OUT = """
import sys, torch, layernorm
assert 'triton' not in sys.modules, 'importing layernorm imported triton'
for name in (*layernorm.NORMS, layernorm.NO_NORM):
    norm = layernorm.make_norm(name, 768)
    x = torch.randn(2, 3, 768, requires_grad=True)
    norm(x).square().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all(), name
    print(name, 'ok')
"""

REFUSED = """
import torch, layernorm
try:
    layernorm.make_norm('triton', 8)(torch.randn(2, 8))
except layernorm.TritonUnavailableError as e:
    print(e)
"""


@pytest.mark.slow  # two fresh interpreters
def test_the_two_files_work_copied_into_an_empty_folder(tmp_path: Path):
    """The README's promise to an engineer: layernorm.py alone needs only torch, and with layernorm_triton.py beside
    it every norm make_norm knows builds, runs forward and backward, in a folder holding those two files alone.
    Without TRITON_INTERPRET, a CPU input to the Triton norm is refused with the reason and the fixes."""
    for name in ("layernorm.py", "layernorm_triton.py"):
        shutil.copy(ROOT / name, tmp_path / name)
    proc = python("-c", COPIED_OUT, cwd=tmp_path, timeout=300, drop=("PYTHONPATH",), TRITON_INTERPRET="1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [w for n in (*layernorm.NORMS, layernorm.NO_NORM) for w in (n, "ok")]
    proc = python("-c", REFUSED, cwd=tmp_path, timeout=300, drop=("PYTHONPATH", "TRITON_INTERPRET"))
    assert proc.returncode == 0, proc.stderr
    assert "device cpu" in proc.stdout and "CUDA" in proc.stdout and "'builtin'" in proc.stdout, proc.stdout
    assert "TRITON_INTERPRET=1" in proc.stdout and "here it is unset" in proc.stdout, proc.stdout


def test_the_device_check_asks_the_mode_the_kernels_were_defined_in(monkeypatch):
    """Once layernorm_triton is imported, its INTERPRET decides for a CPU tensor, whatever the environment says
    now: kernels compiled for a GPU cannot take CPU tensors because TRITON_INTERPRET=1 was set afterwards."""
    check_triton_device("cuda")
    # any other device (a Mac's mps): the reason, and the ways out, the interpreter on the CPU among them
    with pytest.raises(TritonUnavailableError, match=r"^norm 'triton' cannot run on device mps: .*CUDA GPU") as e:
        check_triton_device("mps")
    assert "--device=cpu" in str(e.value) and "TRITON_INTERPRET=1" in str(e.value) and "'builtin'" in str(e.value)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(lt, "INTERPRET", True)
    check_triton_device("cpu")
    monkeypatch.setattr(lt, "INTERPRET", False)
    with pytest.raises(TritonUnavailableError, match="only after this process had compiled the kernels for a GPU"):
        check_triton_device("cpu")  # (the module asks before it launches: batch_independence skips its row)
