"""``torch.compile(mode="reduce-overhead")``: CUDA graph trees' private pool, warm-up, recording
and replays in the trace (``tracing/compiler/cuda_graph_trees.py``)."""

from __future__ import annotations

from xmem_engine import trace as tr
from xmem_engine.simulation.simulate import simulate
from xmem_engine.tracing import trace
from tests.tracing.test_torch_compile import H100, MLP, pytestmark  # noqa: F401 - (skipped without Inductor)

# test_torch_compile's MLP step with a mode, a number of steps and its loss held between steps
TRAIN = (MLP.replace("torch.compile(model)", "torch.compile(model, mode=MODE)").replace("range(2)", "range(STEPS)")
         .replace("step(x, t).backward()", "loss = step(x, t)\n    loss.backward()"))
assert "MODE" in TRAIN and "STEPS" in TRAIN and "loss = step" in TRAIN


def _train(mode: str = "reduce-overhead", steps: int = 4):
    return trace(TRAIN.replace("MODE", repr(mode)).replace("STEPS", str(steps)), {}, mode="fake", device=H100)


def _pool_calls(events) -> list[list[tr.TraceEvent]]:
    """The events of each call inside the pool, in order."""
    calls, inside = [], None
    for e in events:
        if e.kind == tr.POOL_BEGIN:
            assert inside is None and e.id == 1
            inside = []
        elif e.kind == tr.POOL_END:
            calls.append(inside)
            inside = None
        elif inside is not None:
            inside.append(e)
    assert inside is None
    return calls


def test_each_graph_warms_up_records_and_replays_in_one_private_pool():
    t = _train()
    info = t.meta["compile"]["cuda_graphs"]
    assert info == {"graphs": 2, "recorded": 2, "replays": 4, "made": 0, "copied_inputs": 3, "skipped": [],
                    "step_marks": 0}
    calls = _pool_calls(t.events)
    assert len(calls) == 8  # forward and backward, four steps
    # the tree manager's empty capture, which makes the pool, empties the cache before the first warm-up
    first = next(i for i, e in enumerate(t.events) if e.kind == tr.POOL_BEGIN)
    assert t.events[first - 1].kind == tr.EMPTY_CACHE
    side = {e.stream for c in calls for e in c if e.kind == tr.ALLOC}
    assert len(side) == 1 and 0 not in side  # the tree manager's side stream
    outside = [e for e in t.events if e.kind == tr.ALLOC and e.stream != 0]
    assert len(outside) == sum(e.kind == tr.ALLOC for c in calls for e in c)  # nothing of it outside the pool
    # the forward's recording (step 2): x and target copied into the pool, then torch.cuda.graph's empty_cache
    rec = calls[2]
    assert [(e.kind, e.shape) for e in rec[:3]] == [(tr.ALLOC, (32, 64)), (tr.ALLOC, (32, 64)), (tr.EMPTY_CACHE, ())]
    # the backward's recording copies its gradient seed (not static); its saved tensors are static
    assert [(e.kind, e.shape) for e in calls[3][:2]] == [(tr.ALLOC, ()), (tr.EMPTY_CACHE, ())]
    # replays ask for what the recording asked for, less the copies: the same requests each step
    sizes = [[e.bytes for e in c if e.kind == tr.ALLOC] for c in calls]
    assert sizes[4] == sizes[6] and sizes[5] == sizes[7]
    assert sizes[4] == [e.bytes for e in rec[2:] if e.kind == tr.ALLOC]
    notes = " ".join(t.meta["notes"])
    assert "CUDA graphs (mode='reduce-overhead'): 2 graphs in one private memory pool" in notes
    assert "not modelled" not in notes and "cudagraph_mark_step_begin" not in notes


def test_steps_the_code_marks_are_named_as_not_followed():
    """The trees' generations (``torch.compiler.cudagraph_mark_step_begin``) are not modelled:
    the notes say so, where the code marks its steps."""
    code = TRAIN.replace("MODE", "'reduce-overhead'").replace("STEPS", "3").replace(
        "loss = step(x, t)", "torch.compiler.cudagraph_mark_step_begin()\n    loss = step(x, t)")
    assert "cudagraph_mark_step_begin()" in code
    t = trace(code, {}, mode="fake", device=H100)
    assert t.meta["compile"]["cuda_graphs"]["step_marks"] == 3
    notes = " ".join(t.meta["notes"])
    assert "cudagraph_mark_step_begin() was called 3 times; the trees' generations are not followed" in notes


def test_replays_reserve_nothing_more():
    """After the recording the pool holds what the graphs need: more steps reserve nothing more."""
    three, six = simulate(_train(steps=3)), simulate(_train(steps=6))
    assert six.peak_reserved_bytes == three.peak_reserved_bytes
    assert six.peak_allocated_bytes == three.peak_allocated_bytes


def test_the_pool_is_apart_from_the_rest_of_the_step():
    """The default mode's step reuses freed activations for the next step's inputs and the
    optimizer; with CUDA graphs the pool's blocks serve only the graphs."""
    default, graphs = _train("default"), _train()
    assert not _pool_calls(default.events) and default.meta["compile"]["cuda_graphs"]["graphs"] == 0
    assert simulate(graphs).peak_reserved_bytes > simulate(default).peak_reserved_bytes


HELD = """
import torch
f = torch.compile(lambda x: (x @ x).relu(), mode="reduce-overhead")
x = torch.randn(1024, 1024, device="cuda")
outs = [f(x) for _ in range(CALLS)]
"""


def test_a_replay_writes_over_the_outputs_the_code_still_holds():
    """Outputs of a graph are the recording's memory: a list of them holds one block, as the GPU's
    replays write each call's result over the last (the older tensors are stale there)."""
    r = {n: simulate(trace(HELD.replace("CALLS", str(n)), {}, mode="fake", device=H100)) for n in (3, 7)}
    assert r[7].peak_reserved_bytes == r[3].peak_reserved_bytes
    t = trace(HELD.replace("CALLS", "4"), {}, mode="fake", device=H100)
    calls = _pool_calls(t.events)
    out_ids = [next(e.id for e in reversed(c) if e.kind == tr.ALLOC) for c in calls]
    freed_before = {e.id for e in t.events[:[i for i, e in enumerate(t.events) if e.kind == tr.POOL_BEGIN][-1]]
                    if e.kind == tr.FREE}
    assert set(out_ids[:3]) <= freed_before  # each given back before the next call


def _requests(t) -> list[tuple]:
    """The events, each stream named by its order of appearance (stream numbers go on across traces)."""
    streams: dict[int, int] = {}
    return [(e.kind, e.bytes, streams.setdefault(e.stream, len(streams)), e.category, e.op, e.shape, e.dtype,
             e.phase, e.iteration) for e in t.events]


def test_replays_made_from_their_pattern_ask_what_run_ones_ask(monkeypatch, steps=7):
    """Once two real replays of a graph agree, the later ones are made from their pattern
    (graph_replays.py): the same requests, in the same order, as running them."""
    held = HELD.replace("CALLS", str(steps))
    made = trace(held, {}, mode="fake", device=H100)
    assert made.meta["compile"]["cuda_graphs"]["made"] == steps - 4  # warm-up, recording, two real replays
    # a training step's backward frees the saved tensors it is given: its replays always run
    step = _train(steps=6)
    assert step.meta["compile"]["cuda_graphs"]["made"] == 2  # the forward's steps 5 and 6
    monkeypatch.setenv("XMEM_REPLAY_GRAPHS", "0")
    run = trace(held, {}, mode="fake", device=H100)
    assert run.meta["compile"]["cuda_graphs"]["made"] == 0
    assert _requests(made) == _requests(run)
    assert _requests(step) == _requests(_train(steps=6))


MUTATES = """
import torch
@torch.compile(mode="reduce-overhead")
def f(x, buf):
    buf.add_(1)
    return x * 2 + buf.sum()
buf = torch.zeros(1024, device="cuda")
x = torch.randn(1024, 1024, device="cuda")
for i in range(3):
    y = f(x, buf)
"""


def test_a_graph_that_writes_into_an_input_it_does_not_own_runs_outside_the_pool():
    t = trace(MUTATES, {}, mode="fake", device=H100)
    assert not _pool_calls(t.events)
    info = t.meta["compile"]["cuda_graphs"]
    assert info["graphs"] == 0 and info["skipped"] and "mutated inputs" in info["skipped"][0]
    assert any("Inductor left 1 graph out (mutated inputs" in n for n in t.meta["notes"])


def test_max_autotune_takes_cuda_graphs_too():
    """``mode="max-autotune"`` turns CUDA graphs on as well; Inductor then cuts the graph into
    partitions around what a graph cannot hold, and each partition is one in the pool."""
    t = trace(TRAIN.replace("MODE", '"max-autotune"').replace("STEPS", "3"), {}, mode="fake", device=H100)
    info = t.meta["compile"]
    assert info["failures"] == 0 and info["cuda_graphs"]["recorded"] == info["cuda_graphs"]["graphs"] >= 2
    assert len(_pool_calls(t.events)) == 3 * info["cuda_graphs"]["graphs"]
    assert any(n.startswith("CUDA graphs (mode='max-autotune'): ") for n in t.meta["notes"])
