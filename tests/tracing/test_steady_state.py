"""A cell's training step runs until the steady state (issue #35 item 2): the model and
optimizer built once, the step twice, the peak the training loop's."""

from __future__ import annotations

import types

import pytest

from xmem_engine.estimate import estimate
from xmem_engine.tracing import trace

# Activations (16384 x 16384 fp32 hidden) dwarf the weights: the second step holds AdamW's
# state while they live, the first does not.
STEP = """
import torch, torch.nn as nn
built.k += 1
model = nn.Sequential(nn.Linear(4096, 16384), nn.ReLU(), nn.Linear(16384, 4096)).cuda()
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(16384, 4096, device="cuda")
loss = model(x).square().mean()
loss.backward()
opt.step()
opt.zero_grad()
losses.append(1.0)
"""


def _steady_notes(tr) -> list[str]:
    return [n for n in tr.meta.get("notes", []) if "training step" in n]


def test_one_step_runs_twice_with_the_model_built_once():
    built, losses = types.SimpleNamespace(k=0), []
    est = estimate(STEP, "A100-SXM4-40GB", namespace={"built": built, "losses": losses}, mode="fake", steps=None)
    assert est.trace.meta["iterations"] == 2 and built.k == 1
    assert est.steps == 3  # this cache settles at step 3: the third is simulated (simulation/settle.py)
    assert _steady_notes(est.trace) == [
        "steady state: the cell's training step (lines 6-11) ran 2 times on a model and optimizer built once "
        "(lines 2-5); -n 1 estimates the first step alone"]
    first = estimate(STEP, "A100-SXM4-40GB", namespace={"built": built, "losses": []}, mode="fake", steps=1)
    assert first.steps == 1 and first.first_step_peak_device_bytes is None and not _steady_notes(first.trace)
    # the first step of the loop is the single step; the loop peaks higher (AdamW's state + activations)
    assert est.first_step_peak_device_bytes == first.peak_device_bytes
    assert est.peak_device_bytes > first.peak_device_bytes + (512 << 20)
    assert est.to_json()["first_step_peak_device_bytes"] == first.peak_device_bytes


def test_plain_values_are_handed_back_as_one_run_leaves_them():
    ns = {"built": types.SimpleNamespace(k=0), "losses": []}
    trace(STEP + "count = len(losses)\n", ns, mode="fake", steps=3)
    assert ns["count"] == 1 and ns["losses"] == [1.0]


def test_n_steps_runs_the_step_n_times():
    ns = {"built": types.SimpleNamespace(k=0), "losses": []}
    tr = trace(STEP, ns, mode="fake", steps=3)
    assert tr.meta["iterations"] == 3 and ns["built"].k == 1
    assert _steady_notes(tr) == ["the cell's training step (lines 6-11) ran 3 times on a model and optimizer "
                                 "built once (lines 2-5)"]


LOOP = """
import torch
model = torch.nn.Linear(64, 64).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(8, 64, device="cuda")).sum().backward()
    opt.step(); opt.zero_grad()
"""


@pytest.mark.parametrize("code, iterations", [
    (LOOP, 3),  # a loop of its own: as written
    ("import torch\nm = torch.nn.Linear(64, 64).cuda()\nwith torch.no_grad():\n    y = m(torch.randn(8, 64, device='cuda'))\n", 1),
])
def test_a_loop_or_an_inference_is_left_as_written(code, iterations):
    tr = trace(code, {}, mode="fake", steps=None)
    assert tr.meta["iterations"] == iterations and not _steady_notes(tr)


def test_a_step_that_cannot_run_again_is_said_not_failed():
    code = ("import torch\nbatches = iter([torch.randn(8, 64)])\nmodel = torch.nn.Linear(64, 64).cuda()\n"
            "x = next(batches).cuda()\nmodel(x).sum().backward()\n")
    tr = trace(code, {}, mode="fake", steps=None)
    assert tr.meta["iterations"] == 1
    assert _steady_notes(tr) == ["steady state: the cell's training step (lines 4-5) ran 1 time on a model and "
                                 "optimizer built once (lines 1-3); run 2 failed (StopIteration at line 4), so the "
                                 "estimate covers it until then"]


def test_a_model_run_before_the_optimizer_is_built_is_one_pass():
    code = ("import torch\nmodel = torch.nn.Linear(64, 64).cuda()\nmodel(torch.randn(1, 64, device='cuda'))\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel(torch.randn(8, 64, device='cuda')).sum().backward()\n"
            "opt.step()\n")
    tr = trace(code, {}, mode="fake", steps=None)
    assert tr.meta["iterations"] == 1
    assert _steady_notes(tr) and "estimated as one pass over the cell" in _steady_notes(tr)[0]


def test_an_error_in_the_first_pass_is_the_cells_own_at_its_line():
    import traceback

    code = "import torch\nm = torch.nn.Linear(4, 4).cuda()\nm(torch.randn(2, 4, device='cuda')).sum().backward()\nraise KeyError('x')\n"
    with pytest.raises(KeyError) as info:
        trace(code, {}, mode="fake", steps=None, filename="In[3]")
    frames = [f for f in traceback.extract_tb(info.value.__traceback__) if f.filename == "In[3]"]
    assert [f.lineno for f in frames] == [4]


def test_a_cache_still_growing_in_the_last_step_is_said():
    """This step's cache settles at the third step (reserved 1 GiB higher than in the second)
    and stays there: with 3 steps the estimate says so, with 4 it does not."""
    def run(steps):
        return estimate(STEP, "A100-SXM4-40GB", namespace={"built": types.SimpleNamespace(k=0), "losses": []},
                        mode="fake", steps=steps)

    three, four = run(3), run(4)
    growing = [n for n in three.notes if "had not settled" in n]
    assert growing and growing[0].startswith("the allocator reserved 1.00 GiB more in step 3")
    assert not [n for n in four.notes if "had not settled" in n]
    assert four.peak_device_bytes == three.peak_device_bytes


def test_a_cache_that_settles_after_step_two_is_simulated_to_its_settled_peak():
    """The steady state traces two steps; where the cache grows in a third, the third step's
    requests are the second's, appended in simulation (simulation/settle.py): the same requests,
    in the same order, as a traced third step, and its peak, without tracing it."""
    def run(steps):
        return estimate(STEP, "A100-SXM4-40GB", namespace={"built": types.SimpleNamespace(k=0), "losses": []},
                        mode="fake", steps=steps)

    def requests(est):
        return [(str(e.kind), e.bytes, str(e.category)) for e in est.simulated_events if e.kind in ("alloc", "free")]

    steady, two, three = run(None), run(2), run(3)
    assert steady.trace.meta["iterations"] == 2 and steady.steps == 3
    assert requests(steady) == requests(three)
    assert steady.peak_device_bytes == three.peak_device_bytes == two.peak_device_bytes + (1 << 30)
    assert steady.peak_reserved_bytes == three.peak_reserved_bytes
    settled = [n for n in steady.notes if n.startswith("the allocator's cache grew after the second step")]
    assert settled == ["the allocator's cache grew after the second step: the step's requests were repeated in "
                       "simulation (1 more, 3 steps) until it settled; 1.00 GiB more reserved than over the two "
                       "traced steps"]
    assert not [n for n in steady.notes if "had not settled" in n]
    assert not [n for n in two.notes if "grew after the second step" in n]  # -n 2 is what was asked


def test_a_step_that_is_not_periodic_is_not_repeated():
    from xmem_engine.simulation.settle import repeated
    from xmem_engine.trace import ALLOC, FREE, TraceEvent

    def a(i, n):
        return TraceEvent(ALLOC, id=i, bytes=n, op="aten.empty")

    # before the pass: x0 (64 B). The pass frees x0 and leaves x1 in its place: periodic
    events = [a(0, 64), TraceEvent(FREE, id=0, bytes=64), a(1, 64), a(2, 8), TraceEvent(FREE, id=2, bytes=8),
              TraceEvent(FREE, id=1, bytes=64)]
    events = [events[0], events[2], events[1], events[3], events[4], events[5]]  # x1 made, x0 freed, a temp
    out = repeated(events, 1, 5, 2)
    assert [(str(e.kind), e.bytes) for e in out] == [("alloc", 64)] + [("alloc", 64), ("free", 64), ("alloc", 8),
                                                                        ("free", 8)] * 3 + [("free", 64)]
    live: set = set()
    for e in out:  # every id made once and freed once, each free after its alloc
        if e.kind == ALLOC:
            assert e.id not in live
            live.add(e.id)
        else:
            live.remove(e.id)
    assert not live
    # the pass frees a 64 B object made before it but leaves nothing of that kind in its place
    assert repeated([a(0, 64), a(1, 32), TraceEvent(FREE, id=0, bytes=64)], 1, 3, 1) is None


def test_a_model_built_again_at_the_dead_one_s_address_is_a_build():
    """``model = Model()`` run again (a cell that rebuilds its model) binds a new object, which
    CPython often puts where the old one was: compared by id it was the same model, not a build."""
    import torch.nn as nn

    from xmem_engine.tracing.steady import Pass

    for _ in range(200):  # a new module at a freed one's address
        g = {"model": nn.Linear(2, 2)}
        p = Pass(lines=((1, 1), (2, 2)), filename="<cell>")
        p._observe(g)
        p._current, old = 0, id(g["model"])
        del g["model"]
        g["model"] = nn.Linear(2, 2)
        if id(g["model"]) == old:
            p._observe(g)
            assert p.builds == [True]
            return
    pytest.skip("CPython put no new module at a freed one's address")
