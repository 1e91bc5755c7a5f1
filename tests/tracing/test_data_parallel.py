"""``nn.DataParallel`` on the virtual GPU (``tracing/shims/data_parallel.py``): its scatter and
gather are C++ in PyTorch (missing from the CPU wheel, a driver call on the CUDA one); here they
allocate as ``torch/csrc/cuda/comm.cpp`` does, on either wheel."""

from __future__ import annotations

import pytest

from xmem_engine import trace as tr
from xmem_engine.tracing import trace

STEP = """
import torch, torch.nn as nn
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 10))
model = {wrap}
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    x = torch.randn(256, 512{x_device})
    y = torch.randint(0, 10, (256,), device="cuda")
    loss = nn.functional.cross_entropy(model(x{x_to}), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _requests(t: tr.Trace) -> list[tuple]:
    return [(e.kind, e.bytes, e.stream, e.category) for e in t.events if e.kind in (tr.ALLOC, tr.FREE)]


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_one_gpu_data_parallel_allocates_what_the_bare_module_does(mode):
    """Inputs already on the GPU: the scatter's one piece is a view, and the module is called directly."""
    bare = trace(STEP.format(wrap="net.cuda()", x_device=', device="cuda"', x_to=""), {}, mode=mode)
    dp = trace(STEP.format(wrap="nn.DataParallel(net).cuda()", x_device=', device="cuda"', x_to=""), {}, mode=mode)
    assert _requests(dp) == _requests(bare)
    assert len(_requests(dp)) > 20


def test_inputs_on_the_cpu_are_copied_once_on_the_scatters_side_stream():
    t = trace(STEP.format(wrap="nn.DataParallel(net).cuda()", x_device="", x_to=""), {}, mode="fake")
    copies = [e for e in t.events if e.kind == tr.ALLOC and e.bytes == 256 * 512 * 4]
    assert len(copies) == 2  # one per step
    assert all(e.stream != 0 for e in copies)  # DataParallel's background copy stream
    assert len({e.stream for e in copies}) == 1


def test_scatters_backward_gathers_the_inputs_gradient_into_a_new_tensor():
    code = """
import torch, torch.nn as nn
model = nn.DataParallel(nn.Linear(1024, 1024).cuda())
x = torch.randn(64, 1024, device="cuda", requires_grad=True)
model(x).sum().backward()
assert x.grad.shape == x.shape and x.grad.is_cuda
"""
    t = trace(code, {}, mode="fake")
    grads = [e for e in t.events if e.kind == tr.ALLOC and e.bytes == 64 * 1024 * 4 and "empty" in e.op]
    assert grads, [(e.op, e.bytes) for e in t.events if e.kind == tr.ALLOC]


def test_data_parallel_over_several_gpus_is_refused_with_a_reason():
    code = """
import torch, torch.nn as nn
model = nn.DataParallel(nn.Linear(8, 8).cuda(), device_ids=[0, 1])
model(torch.randn(4, 8, device="cuda"))
"""
    with pytest.raises(NotImplementedError, match="DataParallel over 2 GPUs is not modelled"):
        trace(code, {}, mode="fake")
