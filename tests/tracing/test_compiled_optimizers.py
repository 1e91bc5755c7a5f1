"""Optimizers under ``torch.compile``: their state counted, the tracer's hooks not compiled
(``tracing/compiler/compiled_optimizers.py``, ``gpu_reach.py``)."""

from __future__ import annotations

import torch

from xmem_engine import trace as tr
from xmem_engine.tracing import trace
from tests.tracing.test_torch_compile import H100, pytestmark  # noqa: F401 - (skipped without Inductor)

MiB = 1 << 20

# PyTorch's recipe "(beta) Compiling the optimizer with torch.compile", two layers
RECIPE = """
import torch
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024, False, device="cuda") for _ in range(2)])
output = model(torch.rand(1024, device="cuda"))
output.sum().backward()
opt = torch.optim.Adam(model.parameters(), lr=torch.tensor(0.01))
@torch.compile(fullgraph=False)
def fn():
    opt.step()
for i in range(3):
    fn()
print("allocated", torch.cuda.memory_allocated())
"""

# a compiled training step with the optimizer inside (the model reached through a global)
TRAIN_STEP = """
import torch, torch.nn as nn
model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
@torch.compile
def train_step(x):
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss
for _ in range(3):
    train_step(torch.randn(64, 1024, device="cuda"))
print("allocated", torch.cuda.memory_allocated())
"""


def _states(t):
    return [e for e in t.events if e.kind == tr.ALLOC and e.category == tr.Category.OPTIMIZER_STATE]


def test_the_recipes_compiled_step_is_compiled_and_its_state_counted(capsys):
    t = trace(RECIPE, {}, mode="fake", device=H100)
    assert t.meta["compile"]["graphs"] >= 1, t.meta["notes"]  # a function of no arguments reaches the GPU
    states = _states(t)
    # exp_avg and exp_avg_sq of both weights, made while Dynamo traced; and their steps: Dynamo
    # turns `capturable` on for GPU parameters whose state is not made yet, so the steps are
    # 0-d tensors on the GPU (eagerly they stay on the host)
    assert sorted((e.shape, e.bytes) for e in states) == [((), 4)] * 2 + [((1024, 1024), 4 * MiB)] * 4
    assert {e.iteration for e in states} == {states[0].iteration}
    notes = " ".join(t.meta["notes"])
    assert "graph break" not in notes  # the tracer's own hooks are not the user's breaks
    eager = trace(RECIPE, {}, mode="fake", device=H100, compile="eager")
    out = capsys.readouterr().out.split()
    compiled_bytes, eager_bytes = int(out[1]), int(out[3])
    # weights, gradients, states (lr stays on the host), and the first output
    assert eager_bytes == 2 * 4 * 4 * MiB + 1024 * 4
    assert compiled_bytes == eager_bytes + 2 * 512  # the steps, a 512-byte block each
    assert sorted(e.bytes for e in _states(eager)) == sorted(e.bytes for e in states if e.shape)


def test_an_optimizer_step_inside_a_compiled_training_step_keeps_its_state(capsys):
    t = trace(TRAIN_STEP, {}, mode="fake", device=H100)
    assert t.meta["compile"]["graphs"] >= 2, t.meta["notes"]
    weights = 2 * (1024 * 1024 + 1024) * 4
    # exp_avg, exp_avg_sq (had been none), and the 4 steps on the GPU (capturable, as Dynamo sets it)
    assert sum(e.bytes for e in _states(t)) == 2 * weights + 4 * 4
    # after zero_grad (set_to_none): the weights, their states and steps
    assert int(capsys.readouterr().out.split()[-1]) == 3 * weights + 4 * 512


# `torch.compile(opt.step)`, a bound method, with the optimizer's own `capturable=True`: its
# steps are made with `device=p.device` while Dynamo traces (had asked the real driver)
BOUND_CAPTURABLE = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(0.01), capturable=True)
step = torch.compile(opt.step)
for _ in range(3):
    model(torch.randn(64, 1024, device="cuda")).square().mean().backward()
    step()
    opt.zero_grad()
print("allocated", torch.cuda.memory_allocated())
"""


def test_a_compiled_bound_step_with_capturable_state_is_made_on_the_virtual_gpu(capsys):
    t = trace(BOUND_CAPTURABLE, {}, mode="fake", device=H100)
    assert t.meta["compile"]["graphs"] >= 1 and not t.meta["compile"]["failures"], t.meta["notes"]
    eager = trace(BOUND_CAPTURABLE, {}, mode="fake", device=H100, compile="eager")
    out = capsys.readouterr().out.split()
    assert int(out[1]) == int(out[3])  # capturable eagerly too: the same state on the GPU
    shapes = [(1024, 1024), (1024,), (10, 1024), (10,)]
    for run in (t, eager):
        states = _states(run)
        assert sorted((e.shape, e.bytes) for e in states) == sorted(
            [((), 4)] * 4 + [(s, 4 * torch.Size(s).numel()) for s in shapes for _ in range(2)])


def test_a_compiled_function_on_host_tensors_stays_host_work():
    from xmem_engine.tracing.compiler.gpu_reach import reaches_gpu

    gpu = {1}
    is_gpu = lambda t: id(t) in gpu  # noqa: E731
    w = torch.zeros(2)
    gpu.add(id(w))

    def uses_w():
        return w * 2

    def pure(x):
        return x * 2

    assert reaches_gpu(uses_w, (), {}, is_gpu)
    assert not reaches_gpu(pure, (torch.ones(2),), {}, is_gpu)
