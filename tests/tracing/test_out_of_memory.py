"""An out-of-memory error on the virtual GPU, caught by the code, as on a GPU: the message is
torch's (`` out of memory.``, which accelerate's retry looks for), the allocator's cache is freed
in the trace as cudaMalloc's retry frees it, and what the failed step held is let go. A
backward that raised had kept its graph, every saved activation, until the next backward."""

from __future__ import annotations

from xmem_engine.tracing import trace
from xmem_engine.tracing.virtual_cuda import DEFAULT_DEVICE

RETRY = """
import torch
torch.cuda.set_per_process_memory_fraction(FRACTION)
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).cuda()
params = torch.cuda.memory_allocated()
caught, after = [], []
for batch in (BIG, 64):
    try:
        x = torch.randn(batch, 1024, device="cuda")
        model(x).square().mean().backward()
    except torch.OutOfMemoryError as e:
        caught.append(str(e).split(". ")[0] + ".")
    del x
    model.zero_grad(set_to_none=True)
    torch.randn(1, device="cuda")  # the next op
    after.append(torch.cuda.memory_allocated() - params)
"""

GIB = 1 << 30


def test_a_caught_out_of_memory_in_backward_lets_go_of_the_graph():
    # 1.4 GiB of the device: the forward at 32,768 rows (8 saved outputs of 128 MiB) fits, its backward does not
    ns = {"FRACTION": 1.4 * GIB / DEFAULT_DEVICE["total_memory"], "BIG": 32768}
    tr = trace(RETRY, ns, mode="fake")
    assert ns["caught"] == ["CUDA out of memory."]  # torch's words, which accelerate's retry looks for
    assert ns["after"] == [0, 0]  # nothing of the failed step is held once the next op runs
    assert any(e.kind == "empty_cache" for e in tr.events)  # cudaMalloc's retry emptied the cache


EMPTIED = """
import gc
import torch
torch.cuda.set_per_process_memory_fraction(FRACTION)
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).cuda()
reserved = torch.cuda.memory_reserved()
def step(batch):
    x = torch.randn(batch, 1024, device="cuda")
    model(x).square().mean().backward()
try:
    step(32768)
except torch.OutOfMemoryError:
    pass
# accelerate's retry: gc, then empty_cache, before any other op runs on the device
gc.collect()
torch.cuda.empty_cache()
left = torch.cuda.memory_reserved() - reserved
"""


def test_a_backward_that_raised_holds_nothing_when_the_cache_is_emptied():
    # On a GPU the failed step's graph goes with the exception: an empty_cache right after the
    # except block gives its segments back, and the next try starts on a clean device. The
    # tracer's hold on the last autograd node had kept the graph (every saved activation) past
    # that empty_cache, until the next op: each retry of a batch-size search started on the
    # cache the failed one shaped, and ran out of memory sooner.
    ns = {"FRACTION": 1.4 * GIB / DEFAULT_DEVICE["total_memory"]}
    trace(EMPTIED, ns, mode="fake")
    assert ns["left"] == 0
