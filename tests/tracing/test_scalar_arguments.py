"""A 0-dim tensor given for an op's ``float``/``int`` argument (scalar_arguments.py): on a GPU
C++ reads its value; a fake tensor has none, and the script stopped in fake mode."""

from __future__ import annotations

import torch
from torch._ops import OpOverload, OpOverloadPacket

from xmem_engine.tracing import trace
from xmem_engine.tracing.shims.scalar_arguments import numbers_read

CLIPPED = """
import torch

lib = torch.library.Library("xmemtest_scalar_" + MODE, "DEF")
lib.define("clip_(Tensor(a!) p, Tensor g, float max_norm, int steps) -> ()")

def clip_(p, g, max_norm, steps):
    assert type(max_norm) is float and type(steps) is int  # what C++ gives a kernel
    p.sub_(g * min(1.0, max_norm))

lib.impl("clip_", clip_, "CPU")
lib.impl("clip_", lambda p, g, max_norm, steps: None, "Meta")
op = getattr(torch.ops, "xmemtest_scalar_" + MODE).clip_
model = torch.nn.Linear(256, 256).cuda()
model(torch.randn(64, 256, device="cuda")).square().mean().backward()
with torch.no_grad():
    for p in model.parameters():
        norm = torch.linalg.vector_norm(p.grad)  # a 0-dim tensor, given as the float
        op(p, p.grad, norm, torch.tensor(3))  # the packet
        op.default(p, p.grad, 1.0, norm.to(torch.int64))  # an overload
"""


def _sizes(tr):
    return [(e.kind, e.bytes, e.op) for e in tr.events if e.kind in ("alloc", "free")]


def test_a_tensor_given_for_a_number_is_read_as_on_a_gpu():
    fake = trace(CLIPPED, {"MODE": "fake"}, mode="fake")
    real = trace(CLIPPED, {"MODE": "real"}, mode="real")
    assert fake.mode == "fake"
    assert _sizes(fake) == _sizes(real)
    lines = CLIPPED.split("\n")
    calls = {f"<cell>:{i + 1}" for i, line in enumerate(lines) if line.lstrip().startswith(("op(", "op.default("))}
    assert {g["where"] for g in fake.meta["guesses"]} == calls, fake.meta["guesses"]  # each read, where it was
    # the patches are gone after the trace
    assert OpOverloadPacket.__call__.__module__ == OpOverload.__call__.__module__ == "torch._ops"


def test_only_number_slots_are_read():
    schema = torch.ops.aten.add.Tensor._schema  # add(Tensor self, Tensor other, *, Scalar alpha=1)
    t = torch.tensor(2.0)
    assert numbers_read(schema, (t, t), {}) is None  # tensors where tensors go: nothing read
    args, kwargs = numbers_read(schema, (t, t), {"alpha": torch.tensor(3)})
    assert args[0] is t and args[1] is t and kwargs == {"alpha": 3}
    clamp = torch.ops.aten.clamp.default._schema  # clamp(Tensor self, Scalar? min=None, Scalar? max=None)
    args, _ = numbers_read(clamp, (t, torch.tensor(0.5)), {})
    assert args[1] == 0.5 and type(args[1]) is float
