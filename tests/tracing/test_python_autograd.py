"""The compile-time autograd engine (``tracing/compiler/python_autograd.py``) gives a custom
``autograd.Function``'s gradients to the edges the C++ engine gives them to."""

from __future__ import annotations

from xmem_engine import trace as tr
from xmem_engine.tracing import trace
from tests.tracing.test_torch_compile import H100, pytestmark  # noqa: F401 - (skipped without Inductor)

# A Function whose arguments are not all tensors (a scale, a flag), as Unsloth's fused LoRA
# Functions are: its backward returns one gradient per argument, its node has edges for the
# tensors only. The weight's gradient had gone to the flag's position and was lost.
SCRIPT = """
import torch
class ScaledLoRA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, A, inplace):
        ctx.save_for_backward(x, A)
        ctx.scale = scale
        return (x @ A) @ A.t() * scale
    @staticmethod
    def backward(ctx, dy):
        x, A = ctx.saved_tensors
        dA = (x.t() @ dy + dy.t() @ x) @ A * ctx.scale
        return dy @ A @ A.t() * ctx.scale, None, dA, None
A = torch.nn.Parameter(torch.randn(256, 16, device="cuda"))
@torch.compile
def f(x):
    return ScaledLoRA.apply(x, 0.5, A, True).square().sum()
for n in (32, 48):  # a second size: dynamic shapes pass the graph's SymInts to the Function too
    f(torch.randn(n, 256, device="cuda")).backward()
    print("grad", A.grad is not None)
"""


def test_a_custom_functions_gradient_reaches_its_weight_under_compile(capsys):
    t = trace(SCRIPT, {}, mode="fake", device=H100)
    info = t.meta["compile"]
    assert info["graphs"] >= 1 and info["backward_graphs"] >= 1 and not info["failures"], t.meta["notes"]
    assert capsys.readouterr().out.split() == ["grad", "True", "grad", "True"]
    # the compiled backward's buffer for the weight's gradient, one a step (A.grad keeps the first)
    grads = [e for e in t.events if e.kind == tr.ALLOC and e.phase == "backward" and e.shape == (256, 16)]
    assert len(grads) == 2, [(e.op, e.shape, e.phase) for e in t.events if e.kind == tr.ALLOC]


# ``torch.func.grad_and_value`` inside a compiled function, as TRL's and Unsloth's chunked GRPO
# losses compute each chunk's gradient: Dynamo runs ``autograd.grad`` on its fake ``cuda``
# tensors while it traces, which the C++ engine refuses without a driver ("hasPrimaryContext
# expects a valid device index": the estimate stopped).
FUNC_GRAD = """
import torch
W = torch.randn(64, 128, device="cuda", requires_grad=True)
def chunk_loss(h, labels):
    return torch.nn.functional.cross_entropy(h @ W.t(), labels)
@torch.compile
def accumulate(h, labels):
    (grad_h,), loss = torch.func.grad_and_value(chunk_loss, argnums=(0,))(h, labels)
    return grad_h, loss
h = torch.randn(512, 128, device="cuda")
labels = torch.randint(0, 64, (512,), device="cuda")
grad_h, loss = accumulate(h, labels)
print("grad", tuple(grad_h.shape), grad_h.device.type)
"""


def test_a_functorch_gradient_inside_a_compiled_function(capsys):
    t = trace(FUNC_GRAD, {}, mode="fake", device=H100)
    info = t.meta["compile"]
    assert info["graphs"] == 1 and not info["failures"], t.meta["notes"]  # it had compiled no graph
    assert capsys.readouterr().out.split() == ["grad", "(512,", "128)", "cuda"]
    # the chunk's gradient: a buffer of the compiled graph's wrapper
    assert any(e.kind == tr.ALLOC and e.shape == (512, 128) and e.source.startswith(tuple(info["wrappers"]))
               for e in t.events)
