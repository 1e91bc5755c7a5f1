"""``torch.profiler`` inside traced code profiles the CPU side only (shims/profiler.py): its CUDA
activity had fallen back to CUDA events that fail op by op on a driverless machine, 20x slower."""

from __future__ import annotations

from tests.tracing.test_shadow_values import alloc_stream
from xmem_engine.tracing import trace

STEP = """
import torch, torch.nn as nn
model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512)).cuda()
opt = torch.optim.AdamW(model.parameters())
def step():
    model(torch.randn(64, 512, device="cuda")).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
"""

PROFILED = STEP + """
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True) as prof:
    for _ in range(2):
        step()
names = {e.key for e in prof.key_averages()}
"""


def test_a_profiled_step_is_traced_as_the_same_step_unprofiled():
    ns: dict = {}
    tr = trace(PROFILED, ns, mode="fake")
    assert "aten::addmm" in ns["names"]
    assert [n for n in tr.meta["notes"] if n.startswith("torch.profiler")] == [
        "torch.profiler at <cell>:11: its CUDA activity was off (no kernel runs on the virtual GPU); "
        "it profiled the CPU side of the ops"]
    plain = trace(STEP + "for _ in range(2):\n    step()\n", {}, mode="fake")
    assert alloc_stream(tr) == alloc_stream(plain)
