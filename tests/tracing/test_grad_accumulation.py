"""Autograd's gradient sums under the tracer: in place where a GPU run adds in place."""

from __future__ import annotations


import pytest
import torch

from xmem_engine.tracing import trace

from tests.model_zoo import TINY_LM

MODES = ["fake", "real"]


def backward_adds(src: str, mode: str) -> list[int]:
    tr = trace(src, {}, mode=mode)
    return [e.bytes for e in tr.events if e.kind == "alloc" and e.phase == "backward" and e.op == "aten.add.Tensor"]


@pytest.mark.parametrize("mode", MODES)
def test_a_tensor_used_twice_gets_its_gradients_summed_in_place(mode):
    """input_buffer.cpp accumulate(): the engine holds the only reference -> old.add_(new)."""
    src = """
import torch
x = torch.randn(64, 64, device="cuda", requires_grad=True)
y = x.sin()
(y * 2 + y * 3).sum().backward()
"""
    assert backward_adds(src, mode) == []


def test_the_in_place_sum_gives_the_right_gradient():
    """Real mode computes values: the summed gradient is what plain autograd gives."""
    src = """
import torch
x = torch.randn(64, 64, device="cuda", requires_grad=True)
y = x.sin()
z = torch.tanh(y) * y + y * 3
z.sum().backward()
ref = (1 - torch.tanh(y) ** 2) * y + torch.tanh(y) + 3
assert torch.allclose(x.grad, ref * x.cos(), atol=1e-6), "wrong gradient"
"""
    trace(src, {}, mode="real")  # raises if the assertion in the cell fails
    scatters = """
import torch
x = torch.randn(32, 16, device="cuda", requires_grad=True)
idx = torch.randint(0, 16, (32, 3), device="cuda")
rows = torch.tensor([0, 5, 5, 31], device="cuda")
(x.gather(1, idx).sum() + 2 * x[rows].sum() + 3 * x.max(dim=1).values.sum()).backward()
ref = torch.zeros(32, 16).scatter_add_(1, idx.cpu(), torch.ones(32, 3))
ref.index_put_((rows.cpu(),), torch.full((4, 16), 2.0), accumulate=True)
ref.scatter_add_(1, x.detach().cpu().argmax(dim=1, keepdim=True), torch.full((32, 1), 3.0))
assert torch.equal(x.grad.cpu(), ref), "wrong gradient"
"""
    trace(scatters, {}, mode="real")


@pytest.mark.parametrize("mode", MODES)
def test_sums_stay_out_of_place_where_the_engine_keeps_them_so(mode):
    # create_graph: grad mode is on during backward, the engine never adds in place.
    double = """
import torch
x = torch.randn(64, 64, device="cuda", requires_grad=True)
y = x.sin()
(g,) = torch.autograd.grad((y * 2 + y * 3).sum(), x, create_graph=True)
"""
    assert backward_adds(double, mode) == [64 * 64 * 4]
    # A linear layer's weight gradient is a transposed view: its storage has a second owner
    # (the view's base), so tied weights (embedding + output layer) are summed out of place.
    tied = """
import torch
emb = torch.nn.Embedding(100, 32).cuda()
head = torch.nn.Linear(32, 100, bias=False).cuda()
head.weight = emb.weight
ids = torch.randint(0, 100, (4, 8), device="cuda")
head(emb(ids)).sum().backward()
"""
    assert backward_adds(tied, mode) == [100 * 32 * 4]


@pytest.mark.parametrize("mode", MODES)
def test_residual_blocks_sum_the_skip_gradient_in_place(mode):
    src = """
import torch
class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(256, 256)
    def forward(self, x):
        return x + torch.relu(self.fc(x))
m = torch.nn.Sequential(torch.nn.Linear(256, 256), Block(), Block(), Block()).cuda()
m(torch.randn(128, 256, device="cuda")).sum().backward()
"""
    # each skip's gradient meets the branch's: 3 sums of 128 x 256 floats. Two are done in
    # place; the last block's skip gradient is sum()'s expanded ones (not dense), so that
    # one sum allocates, on a GPU as here.
    assert backward_adds(src, mode) == [128 * 256 * 4]


def backward_ops(src: str, mode: str) -> list[str]:
    tr = trace(src, {}, mode=mode)
    return [e.op for e in tr.events if e.kind == "alloc" and e.phase == "backward"]


@pytest.mark.parametrize("select, scatter, mode", [
    *[(sel, op, mode) for sel, op in [
        ("x.gather(1, idx)", "aten.scatter_add.default"),            # gather_backward
        ("x[idx[:, 0]]", "aten.index_put.default"),                   # index_backward
        ("x.max(dim=1).values", "aten.scatter.src"),                  # value_selecting_reduction_backward
        ("x.index_select(0, idx[:, 0])", "aten.index_add.default"),   # index_select_backward
    ] for mode in MODES],
    # its output size depends on values: real mode only
    ("x.masked_select(x > 0)", "aten.masked_scatter.default", "real"),  # masked_select_backward
])
def test_indexing_gradients_are_scattered_into_their_zeros_in_place(mode, select, scatter):
    """A formula builds the gradient as zeros.op_(...); only under a dispatch mode does it take
    the out-of-place op, which copies the zeros. One allocation of x's size, not two."""
    src = f"""
import torch
x = torch.randn(256, 512, device="cuda", requires_grad=True)
idx = torch.randint(0, 256, (64, 1), device="cuda")
y = {select}
y.sum().backward()
"""
    allocs = [e for e in trace(src, {}, mode=mode).events if e.kind == "alloc" and e.phase == "backward"]
    assert scatter not in [e.op for e in allocs]
    assert len([e for e in allocs if e.bytes == 256 * 512 * 4]) == 1  # the zeros that become x.grad


@pytest.mark.parametrize("mode", MODES)
def test_a_custom_functions_python_backward_runs_as_written(mode):
    src = """
import torch
class Scatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2
    @staticmethod
    def backward(ctx, g):
        z = torch.zeros_like(g)
        return z.scatter_add(1, torch.zeros_like(g, dtype=torch.long), g) + z
x = torch.randn(64, 64, device="cuda", requires_grad=True)
Scatter.apply(x).sum().backward()
"""
    assert "aten.scatter_add.default" in backward_ops(src, mode)




def test_allocating_sums_are_the_ones_autograd_makes_without_a_mode():
    """The engine itself, run plainly under the profiler, says which sums allocate; the
    tracer must allocate for exactly as many (and without the rewrite it allocates more)."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.backward_vs_engine import allocating_ops

    ns: dict = {}
    exec(TINY_LM, ns)
    torch.manual_seed(0)
    model = ns["TinyLM"]()
    loss = model(torch.randint(0, 100, (4, 16)))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss.backward()
    plain = allocating_ops(prof.profiler.kineto_results.events(), more_than=0)["add"]
    in_place = sum(1 for ev in prof.events() if ev.name == "aten::add_")
    assert plain >= 1 and in_place >= 10  # the model exercises both branches
    step = TINY_LM + """
model = TinyLM().cuda()
model(torch.randint(0, 100, (4, 16), device="cuda")).backward()
"""
    for mode in MODES:
        assert len(backward_adds(step, mode)) == plain, mode


def test_the_rewritten_sums_give_autograds_gradients():
    """Real mode computes values: every parameter's gradient equals plain autograd's."""
    ns: dict = {}
    exec(TINY_LM, ns)
    torch.manual_seed(0)
    model = ns["TinyLM"]()
    ids = torch.randint(0, 100, (4, 16))
    model(ids).backward()
    reference = {name: p.grad.clone() for name, p in model.named_parameters()}
    step = TINY_LM + """
torch.manual_seed(0)
model = TinyLM().cuda()
model(ids.cuda()).backward()
for name, p in model.named_parameters():
    assert torch.allclose(p.grad.cpu(), reference[name], atol=1e-6), name
"""
    trace(step, {"ids": ids, "reference": reference}, mode="real")  # raises if a gradient differs


def test_backward_allocations_match_the_engine_op_by_op(capsys):
    """benchmarks/backward_vs_engine.py on the small transformer: every op allocates as often
    under the tracer as in autograd run plainly; only the profiler's nested factories (and
    the 0-d seed gradient it leaves out) differ."""
    from benchmarks import backward_vs_engine

    assert backward_vs_engine.main(["tiny"]) == 0
    out = capsys.readouterr().out
    assert "mm 20" in out and "add 5" in out
    differ = {line.split(":")[1].strip() for line in out.splitlines() if line.strip().startswith("differ:")}
    assert differ <= {"embedding_backward", "empty", "zeros", "ones_like"}, out
