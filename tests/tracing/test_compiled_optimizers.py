"""Optimizers under ``torch.compile``: their state counted, the tracer's hooks not compiled
(``tracing/compiler/compiled_optimizers.py``, ``gpu_reach.py``)."""

from __future__ import annotations

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
    # exp_avg and exp_avg_sq of both weights, made while Dynamo traced (Adam's step stays on the host)
    assert sorted((e.shape, e.bytes) for e in states) == [((1024, 1024), 4 * MiB)] * 4
    assert {e.iteration for e in states} == {states[0].iteration}
    notes = " ".join(t.meta["notes"])
    assert "graph break" not in notes  # the tracer's own hooks are not the user's breaks
    eager = trace(RECIPE, {}, mode="fake", device=H100, compile="eager")
    out = capsys.readouterr().out.split()
    compiled_bytes, eager_bytes = int(out[1]), int(out[3])
    # weights, gradients, states (Adam's step and lr stay on the host), and the first output
    assert compiled_bytes == eager_bytes == 2 * 4 * 4 * MiB + 1024 * 4
    assert sorted(e.bytes for e in _states(eager)) == sorted(e.bytes for e in states)


def test_an_optimizer_step_inside_a_compiled_training_step_keeps_its_state(capsys):
    t = trace(TRAIN_STEP, {}, mode="fake", device=H100)
    assert t.meta["compile"]["graphs"] >= 2, t.meta["notes"]
    weights = 2 * (1024 * 1024 + 1024) * 4
    assert sum(e.bytes for e in _states(t)) == 2 * weights  # exp_avg, exp_avg_sq: had been none
    # after zero_grad (set_to_none): the weights and their states, as eagerly
    assert int(capsys.readouterr().out.split()[-1]) == 3 * weights


def test_a_compiled_function_on_host_tensors_stays_host_work():
    from xmem_engine.tracing.compiler.gpu_reach import reaches_gpu

    gpu = {1}
    is_gpu = lambda t: id(t) in gpu  # noqa: E731
    import torch

    w = torch.zeros(2)
    gpu.add(id(w))

    def uses_w():
        return w * 2

    def pure(x):
        return x * 2

    assert reaches_gpu(uses_w, (), {}, is_gpu)
    assert not reaches_gpu(pure, (torch.ones(2),), {}, is_gpu)
