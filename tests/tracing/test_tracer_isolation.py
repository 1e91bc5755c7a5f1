"""Tracing never changes the user's objects, RNG state, flags or namespace."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensor

from xmem_engine.tracing import trace

MODES = ["fake", "real"]

TRAIN_EXISTING = """
model.to("cuda")
opt = torch.optim.Adam(model.parameters(), lr=0.1)
for _ in range(2):
    loss = model(torch.randn(8, 6, device="cuda")).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    old_opt.step()          # the optimizer made before tracing, over the moved parameters
torch.manual_seed(1234)
model.frozen.requires_grad_(True)
model.train(False)
scalar = 3.5
words = ["a", "b"]
gpu_tensor = torch.ones(2, device="cuda")
host_tensor = torch.ones(2)
new_model = torch.nn.Linear(2, 2).cuda()
def helper():
    return 1
"""


class UserModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 4)
        self.bn = nn.BatchNorm1d(4)
        self.frozen = nn.Parameter(torch.ones(4), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.lin(x)) * self.frozen


def _user_objects():
    torch.manual_seed(0)
    model = UserModel()
    old_opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    # give the old optimizer some state and the params some grads, as a user's session would
    model(torch.randn(8, 6)).sum().backward()
    old_opt.step()
    return model, old_opt


@pytest.mark.parametrize("mode", MODES)
def test_existing_model_optimizer_and_rng_are_untouched(mode):
    model, old_opt = _user_objects()
    params = {n: p for n, p in model.named_parameters()}
    values = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = {n: p.grad for n, p in model.named_parameters()}
    grad_values = {n: (g.clone() if g is not None else None) for n, g in grads.items()}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    opt_state = {id(p): {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()}
                 for p, s in old_opt.state.items()}
    torch.manual_seed(99)
    rng = torch.get_rng_state()
    py_rng, np_rng = random.getstate(), np.random.get_state()[1].copy()

    ns = {"torch": torch, "model": model, "old_opt": old_opt}
    tr = trace(TRAIN_EXISTING, ns, mode=mode)
    assert sum(1 for e in tr.events if e.kind == "alloc" and e.category == "parameter") >= 5

    assert ns["model"] is model and ns["old_opt"] is old_opt
    assert model.training
    for n, p in model.named_parameters():
        assert p is params[n], n
        assert type(p) is nn.Parameter and not isinstance(p, FakeTensor)
        assert p.device.type == "cpu"
        assert torch.equal(p.detach(), values[n]), n
        assert p.grad is grads[n] and (p.grad is None or torch.equal(p.grad, grad_values[n]))
        assert p.requires_grad == flags[n], n
    for n, b in model.named_buffers():
        assert not isinstance(b, FakeTensor) and torch.equal(b, buffers[n]), n
    assert set(old_opt.state) == set(params.values()) - {params["frozen"]}
    for p, s in old_opt.state.items():
        for k, v in s.items():
            want = opt_state[id(p)][k]
            assert (torch.equal(v, want) and not isinstance(v, FakeTensor)) if torch.is_tensor(v) else v == want
    assert old_opt.param_groups[0]["params"] == list(params.values())
    assert torch.equal(torch.get_rng_state(), rng)
    assert random.getstate() == py_rng and np.array_equal(np.random.get_state()[1], np_rng)


@pytest.mark.parametrize("mode", MODES)
def test_namespace_gets_plain_values_only(mode):
    model, old_opt = _user_objects()
    ns = {"torch": torch, "model": model, "old_opt": old_opt}
    trace(TRAIN_EXISTING, ns, mode=mode)
    assert ns["scalar"] == 3.5 and ns["words"] == ["a", "b"]
    for name in ("gpu_tensor", "host_tensor", "new_model", "opt", "loss", "helper"):
        assert name not in ns, name
    for v in ns.values():
        assert not isinstance(v, (torch.Tensor, torch.optim.Optimizer)) or v is old_opt
    assert set(ns) == {"torch", "model", "old_opt", "scalar", "words", "_"}


def test_callable_closure_objects_are_restored():
    model = nn.Linear(3, 3)
    weight = model.weight

    def code():
        model.cuda()
        model(torch.ones(2, 3, device="cuda")).sum().backward()
        model.weight.requires_grad_(False)

    tr = trace(code, mode="fake")
    assert {e.category for e in tr.events if e.kind == "alloc"} >= {"parameter", "gradient"}
    assert model.weight is weight and not isinstance(weight, FakeTensor)
    assert weight.requires_grad and weight.grad is None and weight.device.type == "cpu"


def test_user_state_survives_a_failing_trace():
    model, old_opt = _user_objects()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ns = {"torch": torch, "model": model, "old_opt": old_opt}
    with pytest.raises(RuntimeError, match="boom"):
        trace("model.cuda()\nold_opt.step()\nraise RuntimeError('boom')\n", ns, mode="real")
    assert ns == {"torch": torch, "model": model, "old_opt": old_opt}
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), before[n]) and p.device.type == "cpu"


def _settings() -> tuple:
    m = torch.backends.cuda.matmul
    return (torch.get_default_dtype(), torch.backends.cudnn.benchmark, torch.is_grad_enabled(),
            torch.get_default_device(), torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled(),
            torch.backends.cudnn.allow_tf32, m.allow_tf32, m.allow_fp16_reduced_precision_reduction,
            m.allow_bf16_reduced_precision_reduction, str(torch._tensor_str.PRINT_OPTS.__dict__))


def test_global_settings_and_default_device_are_restored():
    before = _settings()
    src = """
import torch
torch.backends.cudnn.benchmark = not torch.backends.cudnn.benchmark
torch.autograd.set_detect_anomaly(True, check_nan=False)
torch.backends.cudnn.allow_tf32 = not torch.backends.cudnn.allow_tf32
torch.backends.cuda.matmul.allow_tf32 = not torch.backends.cuda.matmul.allow_tf32
torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
torch.set_printoptions(precision=2, sci_mode=True, linewidth=40, threshold=5, edgeitems=1)
torch.set_default_dtype(torch.float64)
torch.set_default_device("cuda")
w = torch.empty(10)                 # on the (virtual) GPU by default now, float64
dev = str(w.device)
torch.set_grad_enabled(False)
"""
    ns: dict = {}
    tr = trace(src, ns, mode="fake")
    assert ns["dev"] == "cuda:0"
    assert [(e.bytes, e.dtype) for e in tr.events if e.kind == "alloc"] == [(80, "float64")]
    assert _settings() == before
    assert torch._C._len_torch_function_stack() == 0


@pytest.mark.parametrize("mode", MODES)
def test_inplace_updates_of_existing_tensors_do_not_leak(mode):
    x = torch.arange(6.0)
    ns = {"x": x, "torch": torch}
    trace("x.mul_(10)\ny = x.cuda()\ny.add_(1)\n", ns, mode=mode)
    assert torch.equal(x, torch.arange(6.0)) and not isinstance(x, FakeTensor)


def test_user_containers_do_not_receive_fake_tensors():
    history: list = [1.5]
    cache: dict = {"kept": 1}
    ns = {"torch": torch, "history": history, "cache": cache}
    trace("x = torch.ones(3, device='cuda')\nhistory.append(x)\ncache['x'] = x\nhistory.append(2)\n", ns, mode="fake")
    assert ns["history"] is history and history == [1.5]
    assert ns["cache"] is cache and cache == {"kept": 1}


@pytest.mark.parametrize("mode", MODES)
def test_numpy_arrays_shared_with_tensors_are_not_written_through(mode):
    import numpy as np

    arr = np.arange(6.0)
    held = {"data": [np.ones(3)]}  # reachable through a container too
    ns = {"arr": arr, "held": held, "torch": torch}
    trace("t = torch.from_numpy(arr)\nt.add_(5)\nu = torch.from_numpy(held['data'][0]).mul_(3)\n"
          "y = t.cuda() * 2\n", ns, mode=mode)
    assert arr.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert held["data"][0].tolist() == [1.0, 1.0, 1.0]


# However a cell reaches a model that existed before it, the model, its gradients and its
# optimizer are as they were afterwards: not only what the namespace names directly.
REACH = """
import functools, torch
class Slotted:
    __slots__ = ("net",)
    def __init__(self, net): self.net = net
class Trainer:
    def __init__(self, net): self.net = net
    def __call__(self): return step(self.net)
def step(net):
    opt = OPTS[id(net)]
    loss = net.cuda()(torch.randn(4, 8, device="cuda")).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
"""


def _models(n):
    torch.manual_seed(0)
    return [torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)) for _ in range(n)]


@pytest.mark.parametrize("mode", MODES)
def test_models_reached_any_way_are_left_unchanged(mode):
    import functools

    helpers: dict = {}
    exec(REACH, helpers)
    nets = _models(8)
    opts = {id(n): torch.optim.Adam(n.parameters(), lr=0.1) for n in nets}
    helpers["OPTS"] = opts
    step = helpers["step"]
    direct, closed, called, partial, slotted, deep, global_, attr = nets

    def closure():
        step(closed)

    holder = type("Holder", (), {})()
    holder.inner = {"a": [{"b": {"c": [attr]}}]}  # deeper than the namespace walk goes
    helpers["G"] = global_
    exec("def via_global():\n    step(G)\n", helpers)
    ns = {"step": step, "direct": direct, "closure": closure, "trainer": helpers["Trainer"](called),
          "partial": functools.partial(step, partial), "slotted": helpers["Slotted"](slotted),
          "deep": [[[[[[deep]]]]]], "via_global": helpers["via_global"], "holder": holder}
    before = [[p.detach().clone() for p in n.parameters()] for n in nets]
    code = ("step(direct)\nclosure()\ntrainer()\npartial()\nstep(slotted.net)\nstep(deep[0][0][0][0][0][0])\n"
            "via_global()\nstep(holder.inner['a'][0]['b']['c'][0])\n")
    trace(code, ns, mode=mode)
    for i, n in enumerate(nets):
        for p, b in zip(n.parameters(), before[i]):
            assert not isinstance(p, FakeTensor) and not isinstance(p.data, FakeTensor), i
            assert p.device.type == "cpu" and torch.equal(p.detach(), b), i
            assert p.grad is None, i
        assert not opts[id(n)].state, i


# Process-wide state a cell changes for its own run (issue #36 item 5): put back after the trace.
CHANGES_PROCESS_STATE = """
import os, torch
os.chdir(elsewhere)
os.environ["XMEM_TEST_SET_BY_CELL"] = "1"
os.environ.pop("XMEM_TEST_KEPT", None)
os.environ["XMEM_TEST_CHANGED"] = "new"
torch.set_float32_matmul_precision("high")
gen.manual_seed(7); torch.rand(3, generator=gen)
rng.random(5); legacy.rand(5); pyrng.random()
torch.randn(4, 4, device="cuda").sum()
"""


@pytest.mark.parametrize("mode", MODES)
def test_cwd_environment_generators_and_matmul_precision_are_restored(mode, tmp_path, monkeypatch):
    import os

    monkeypatch.setenv("XMEM_TEST_KEPT", "kept")
    monkeypatch.setenv("XMEM_TEST_CHANGED", "old")
    monkeypatch.delenv("XMEM_TEST_SET_BY_CELL", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    before_precision = torch.get_float32_matmul_precision()
    ns = {"elsewhere": str(tmp_path / "elsewhere"), "gen": torch.Generator().manual_seed(3),
          "rng": np.random.default_rng(5), "legacy": np.random.RandomState(6), "pyrng": random.Random(8)}
    states = (ns["gen"].get_state(), ns["rng"].bit_generator.state, ns["legacy"].get_state()[1].copy(),
              ns["pyrng"].getstate())
    trace(CHANGES_PROCESS_STATE, ns, mode=mode)
    assert os.getcwd() == str(tmp_path)
    assert os.environ["XMEM_TEST_KEPT"] == "kept" and os.environ["XMEM_TEST_CHANGED"] == "old"
    assert "XMEM_TEST_SET_BY_CELL" not in os.environ
    assert torch.get_float32_matmul_precision() == before_precision  # raised before: mixed TF32 APIs
    assert torch.equal(ns["gen"].get_state(), states[0])
    assert ns["rng"].bit_generator.state == states[1]
    assert (ns["legacy"].get_state()[1] == states[2]).all()
    assert ns["pyrng"].getstate() == states[3]
