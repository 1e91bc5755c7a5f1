"""torchao's float8 training (``convert_to_float8_training``) under the tracer.

Float8Linear's backward made the shadow values hand back a wrapper subclass's inner (meta)
storage as a real value; ``set_`` refused it and the zoo's ``torchao_float8.py`` failed."""

from __future__ import annotations

import pytest

pytest.importorskip("torchao.float8")

STEP = """
import torch
from torchao.float8 import convert_to_float8_training
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)).cuda()
convert_to_float8_training(model)
opt = torch.optim.AdamW(model.parameters())
for _ in range(2):
    model(torch.randn(64, 256, device="cuda")).float().pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
"""


def test_float8_training_traces_in_fake_mode_with_float8_casts():
    from xmem_engine.tracing import trace

    tr = trace(STEP, {}, mode="fake", device={"name": "NVIDIA H100 80GB HBM3", "major": 9, "minor": 0})
    dtypes = {e.dtype for e in tr.events if e.kind == "alloc"}
    assert "float8_e4m3fn" in dtypes, dtypes  # the weights and activations cast for the float8 matmuls
    assert tr.meta["iterations"] >= 2
