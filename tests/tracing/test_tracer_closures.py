"""``optimizer.step(closure)`` (LBFGS, Lightning's automatic optimization): the closure's
forward and backward are the step's forward and backward phases, what they save for backward
is an activation, and only the optimizer's own work is the ``optimizer`` phase (tracer.py)."""

from __future__ import annotations

import collections

import pytest

from xmem_engine.tracing import trace

STEP = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).cuda()
opt = torch.optim.OPTIMIZER(model.parameters(), lr=0.1)
x = torch.randn(64, 256, device="cuda")
for _ in range(3):
BODY
"""

PLAIN = """    opt.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    opt.step()"""

CLOSURE = """    def closure():
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        return loss
    opt.step(CALL)"""


def _allocs(tr) -> list[tuple]:
    return [(e.iteration, str(e.phase), str(e.category), e.op, e.bytes) for e in tr.events if e.kind == "alloc"]


@pytest.mark.parametrize("optimizer", ["Adam", "SGD"])
@pytest.mark.parametrize("call", ["closure", "closure=closure"])
def test_a_step_inside_the_closure_is_attributed_as_one_outside_it(optimizer, call):
    plain = trace(STEP.replace("OPTIMIZER", optimizer).replace("BODY", PLAIN), {}, mode="fake")
    closed = trace(STEP.replace("OPTIMIZER", optimizer).replace("BODY", CLOSURE.replace("CALL", call)), {}, mode="fake")
    assert _allocs(closed) == _allocs(plain)
    phases = collections.Counter((e.iteration, str(e.phase)) for e in closed.events if e.kind == "alloc")
    assert {it for it, _ in phases} == {-1, 0, 1, 2}
    assert all(phases[(it, "forward")] and phases[(it, "backward")] for it in (0, 1, 2))
    cats = collections.Counter(str(e.category) for e in closed.events if e.kind == "alloc")
    assert cats["activation"] == 9 and cats["gradient"] == 12  # 3 saved tensors and 4 gradients a step


def test_lbfgs_calls_its_closure_many_times_in_one_step():
    # Real mode: how often LBFGS calls the closure depends on the loss's values.
    body = CLOSURE.replace("CALL", "closure").replace("opt.zero_grad()", "opt.zero_grad()\n        calls.append(1)")
    src = "per_step = []\n" + STEP.replace("OPTIMIZER", "LBFGS").replace("lr=0.1", "max_iter=3, history_size=2").replace(
        "BODY", "    calls = []\n" + body + "\n    per_step.append(len(calls))").replace("range(3)", "range(2)")
    ns: dict = {}
    tr = trace(src, ns, mode="real")
    a = [e for e in tr.events if e.kind == "alloc"]
    assert {e.iteration for e in a} == {-1, 0, 1}  # one iteration a step, however many closure calls
    assert len(ns["per_step"]) == 2
    for it, calls in zip((0, 1), ns["per_step"]):
        forwards = [e for e in a if e.iteration == it and str(e.phase) == "forward"]
        assert calls > 1 and sum(str(e.category) == "activation" for e in forwards) == 3 * calls
        assert any(str(e.phase) == "optimizer" for e in a if e.iteration == it)  # LBFGS's own buffers
    assert not any(str(e.phase) == "optimizer" and str(e.category) == "activation" for e in a)


OPTIMIZER_IN_BACKWARD = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)).cuda()

@torch.no_grad()
def step(p):  # plain SGD, by hand
    p.add_(p.grad, alpha=-1e-3)
    p.grad = None

for p in model.parameters():
    p.register_post_accumulate_grad_hook(step)
for _ in range(2):
    model(torch.randn(64, 512, device="cuda")).pow(2).mean().backward()
"""


def test_gradients_freed_inside_the_backward_are_gradients():
    # as PyTorch's tutorial "How to save memory by fusing the optimizer step into the backward
    # pass" (there with an optimizer per parameter), each gradient is used and freed by a
    # post-accumulate hook before the backward ends, where the tracer labels gradients: they
    # were "temporary"
    tr = trace(OPTIMIZER_IN_BACKWARD, {}, mode="fake")
    grads = sorted(e.bytes for e in tr.events if e.kind == "alloc" and e.category == "gradient")
    assert grads == sorted([512 * 1024 * 4, 1024 * 4, 1024 * 512 * 4, 512 * 4] * 2), grads
    import torch

    assert torch.Tensor.register_post_accumulate_grad_hook.__qualname__ == "Tensor.register_post_accumulate_grad_hook"


# A backward inside the forward: a force field's forces (the energy's gradient, taken inside the
# model's forward), a gradient penalty or a PINN's derivatives (create_graph=True on a forward's
# result). Before, the forward's phase ended there: what came after was the "other" phase, and
# what it saved for the step's backward was not counted as activations.
FORCES = """
import torch
class ForceField(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.energy = torch.nn.Sequential(torch.nn.Linear(3, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))
        self.head = torch.nn.Linear(3, 512)
    def forward(self, pos):
        e = self.energy(pos).sum()
        forces = -torch.autograd.grad(e, pos, create_graph=True)[0]
        return e, torch.tanh(self.head(forces))
model = ForceField().cuda()
opt = torch.optim.Adam(model.parameters())
for _ in range(2):
    pos = torch.randn(4096, 3, device="cuda", requires_grad=True)
    e, h = model(pos)
    (e + h.square().mean()).backward()
    opt.step(); opt.zero_grad()
"""

PENALTY = """
import torch
critic = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.LeakyReLU(0.2), torch.nn.Linear(512, 1)).cuda()
opt = torch.optim.Adam(critic.parameters())
for _ in range(2):
    x = torch.randn(1024, 128, device="cuda", requires_grad=True)
    out = critic(x)
    g = torch.autograd.grad(out.sum(), x, create_graph=True)[0]
    penalty = (g.norm(2, dim=1) - 1).square().mean() * torch.tanh(g).sum()
    (out.mean() + penalty).backward()
    opt.step(); opt.zero_grad()
"""


@pytest.mark.parametrize("src", [FORCES, PENALTY], ids=["forces-in-forward", "gradient-penalty"])
def test_a_backward_that_builds_a_graph_hands_the_forward_back_its_phase(src):
    tr = trace(src, {}, mode="fake")
    allocs = [e for e in tr.events if e.kind == "alloc" and e.iteration >= 0]
    assert {e.iteration for e in allocs} == {0, 1}
    assert not any(str(e.phase) == "other" and str(e.category) != "input" for e in allocs)
    # the tanh after the inner gradient is saved for the step's backward: an activation of the forward
    for it in (0, 1):
        tanh = [e for e in allocs if e.iteration == it and e.op == "aten.tanh.default"]
        assert str(tanh[-1].phase) == "forward" and str(tanh[-1].category) == "activation"
