"""Sparse tensors on the virtual GPU: a graph's adjacency (pygcn's ``torch.spmm``), moved as the
indices and values it is made of. Fake tensors keep a sparse tensor's shape, not its entries:
what sparse ops make from one (a transpose in backward) is run in real mode instead."""

from __future__ import annotations

import pytest

from xmem_engine.simulation.simulate import simulate
from xmem_engine.tracing import trace

GCN = """
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
n, f = 2000, 64
idx = torch.randint(0, n, (2, 30000))
adj = torch.sparse_coo_tensor(idx, torch.rand(idx.shape[1]), (n, n)).coalesce()
adj = LAYOUT
nnz = adj._nnz() if adj.layout is torch.sparse_coo else adj.values().numel()
w = nn.Linear(f, 32).cuda()
adj, x = adj.cuda(), torch.randn(n, f, device="cuda")
on_gpu, moved_nnz = str(adj.device), (adj._nnz() if adj.layout is torch.sparse_coo else adj.values().numel())
loss = F.relu(torch.sparse.mm(adj, w(x))).sum()
STEP
"""


def test_a_sparse_adjacency_moves_with_its_entries_in_fake_mode():
    src = GCN.replace("LAYOUT", "adj").replace("STEP", "")
    fake_ns: dict = {}
    fake, real = trace(src, fake_ns, mode="fake"), trace(src, {}, mode="real")
    nnz = fake_ns["nnz"]
    assert fake_ns["on_gpu"] == "cuda:0" and fake_ns["moved_nnz"] == nnz
    inputs = sorted(e.bytes for e in fake.events if e.kind == "alloc" and e.category == "input")
    assert 4 * nnz in inputs and 16 * nnz in inputs  # fp32 values, int64 index pairs
    assert simulate(fake.events).peak_allocated_bytes == simulate(real.events).peak_allocated_bytes


@pytest.mark.parametrize("layout", ["adj", "adj.to_sparse_csr()"])
def test_what_fake_tensors_cannot_make_of_a_sparse_tensor_runs_in_real_mode(layout):
    """Backward transposes the adjacency (its entries unknown to a fake tensor); a compressed
    layout is not moved in fake mode at all. Auto mode says so and traces in real mode."""
    src = GCN.replace("LAYOUT", layout).replace("STEP", "loss.backward()")
    with pytest.raises(Exception, match="fake tensors keep no entries of a sparse tensor"):
        trace(src, {}, mode="fake")
    auto, real = trace(src, {}, mode="auto"), trace(src, {}, mode="real")
    assert auto.mode == "real" and "sparse tensor" in auto.meta["fallback"]
    assert simulate(auto.events).peak_allocated_bytes == simulate(real.events).peak_allocated_bytes
