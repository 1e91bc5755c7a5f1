"""CUDA graphs and memory pools the code makes itself (``tracing/cuda_graphs.py``): captured
into private pools, replayed without allocating, on the CPU wheel and the CUDA one alike."""

from __future__ import annotations

from xmem_engine import trace as tr
from xmem_engine.simulation.simulate import simulate
from xmem_engine.tracing import trace

H100 = {"name": "NVIDIA H100 80GB HBM3", "total_memory": 85_045_870_592, "major": 9, "minor": 0,
        "multi_processor_count": 132}
MiB = 1 << 20

# PyTorch's "CUDA Graphs" documentation example: warm up on a side stream, capture, replay
WHOLE_NETWORK = """
import torch
model = torch.nn.Linear(1024, 1024).cuda()
static_x = torch.randn(64, 1024, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        y = model(static_x)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    static_y = model(static_x)
    capturing = torch.cuda.is_current_stream_capturing()
for i in range(5):
    static_x.copy_(torch.randn(64, 1024, device="cuda"))
    g.replay()
assert capturing and not torch.cuda.is_current_stream_capturing()
"""


def _kinds(t):
    return [e.kind for e in t.events if e.kind not in (tr.PHASE, tr.ITERATION)]


def test_a_capture_allocates_in_the_graphs_pool_and_a_replay_allocates_nothing():
    t = trace(WHOLE_NETWORK, {}, mode="fake", device=H100)
    kinds = _kinds(t)
    i = kinds.index(tr.POOL_BEGIN)
    assert kinds[i - 1] == tr.EMPTY_CACHE  # torch.cuda.graph synchronises and empties the cache first
    assert kinds[i:i + 3] == [tr.POOL_BEGIN, tr.ALLOC, tr.POOL_END]  # the static output, and nothing else
    begin = next(e for e in t.events if e.kind == tr.POOL_BEGIN)
    out = next(e for e in t.events if e.kind == tr.ALLOC and e.op == "aten.addmm.default" and e.stream == begin.streams[0])
    assert begin.streams[0] not in (0, 1)  # torch.cuda.graph's own capture stream, not the warm-up's
    # after the capture: only the new inputs (randn), nothing for the five replays
    after = [e for e in t.events[t.events.index(out):] if e.kind == tr.ALLOC]
    assert [e.op for e in after[1:]] == ["aten.randn.default"] * 5
    r = simulate(t)
    assert r.final_reserved_bytes >= 2 * MiB + 2 * MiB  # the pool's 2 MiB segment stays apart from the global one


TWO_GRAPHS = """
import torch
x = torch.randn(4 << 20, device="cuda")  # 16 MiB
pool = torch.cuda.graph_pool_handle()
g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
with torch.cuda.graph(g1, pool=pool):
    a = (x * 2).sum()
with torch.cuda.graph(g2, pool=g1.pool()):
    b = (x * 3).sum()
assert g1.pool() == g2.pool() == pool
torch.cuda.empty_cache()
kept = torch.cuda.memory_reserved()
g1.reset(); g2.reset(); del a, b
torch.cuda.empty_cache()
print(kept, torch.cuda.memory_reserved())
"""


def test_graphs_sharing_a_pool_keep_it_until_each_is_reset(capsys):
    t = trace(TWO_GRAPHS, {}, mode="fake", device=H100)
    begins = [e for e in t.events if e.kind == tr.POOL_BEGIN]
    assert len(begins) == 2 and begins[0].id == begins[1].id
    assert sum(e.kind == tr.POOL_RELEASE for e in t.events) == 2
    kept, after = (int(v) for v in capsys.readouterr().out.split()[-2:])
    # x, and the pool's segments: x * 2's 16 MiB (x * 3 reuses it in g2) and a small one for the sums
    assert kept == 16 * MiB + 16 * MiB + 2 * MiB
    assert after == 16 * MiB  # both graphs reset: the pool's segments go at the next empty_cache


MEMPOOL = """
import torch
pool = torch.cuda.MemPool()
with torch.cuda.use_mem_pool(pool):
    a = torch.empty(30 << 20, dtype=torch.uint8, device="cuda")
del a
b = torch.empty(30 << 20, dtype=torch.uint8, device="cuda")  # not from the pool's cached block
torch.cuda.empty_cache()
print(torch.cuda.memory_reserved(), pool.use_count(), len(pool.snapshot()))
"""


def test_a_mempools_blocks_serve_only_its_own_requests(capsys):
    trace(MEMPOOL, {}, mode="fake", device=H100)
    reserved, users, segments = (int(v) for v in capsys.readouterr().out.split()[-3:])
    assert reserved == 60 * MiB and users == 1 and segments == 1


GRAPHED = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model = torch.cuda.make_graphed_callables(model, (torch.randn(64, 1024, device="cuda"),))
for i in range(3):
    model(torch.randn(64, 1024, device="cuda")).sum().backward()
    opt.step(); opt.zero_grad(set_to_none=True)
"""


def test_make_graphed_callables_captures_forward_and_backward_into_one_pool():
    t = trace(GRAPHED, {}, mode="fake", device=H100)
    begins = [e for e in t.events if e.kind == tr.POOL_BEGIN]
    assert len(begins) == 2 and begins[0].id == begins[1].id  # forward and backward graphs, one pool
    inside, pooled = False, []
    for e in t.events:
        if e.kind in (tr.POOL_BEGIN, tr.POOL_END):
            inside = e.kind == tr.POOL_BEGIN
        elif e.kind == tr.ALLOC and inside:
            pooled.append(e)
    # the backward capture's weight gradients are the graph's static outputs, in the pool
    assert sorted(e.bytes for e in pooled if e.category == "gradient") == [4096, 16384, 16 * MiB, 16 * MiB]
    last = max(i for i, e in enumerate(t.events) if e.kind == tr.POOL_END)
    # the training steps replay: their only requests are the new inputs and the loss's sum
    ops = {e.op for e in t.events[last:] if e.kind == tr.ALLOC}
    assert ops <= {"aten.randn.default", "aten.sum.default", "aten.ones_like.default"}, ops


def test_fake_tensors_data_pointers_are_not_the_users_warning():
    """make_graphed_callables reads its inputs' data_ptr(), as code on a GPU may: FakeTensor's
    deprecation warning about it is xmem's business (a fresh process: torch warns once)."""
    import os
    import subprocess
    import sys

    code = f"from xmem_engine.tracing import trace\ntrace({GRAPHED!r}, {{}}, mode='fake')\n"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))))
    assert run.returncode == 0, run.stderr[-2000:]
    assert "data pointer of FakeTensor" not in run.stderr
