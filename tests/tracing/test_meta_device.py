"""The ``meta`` device under the tracer: a tensor made there holds no memory, wherever its input
lives, and a fake parameter's class rebuilds a parameter. accelerate's offloading
(``device_map="auto"`` with layers on the CPU or disk) moves each offloaded layer's weights to
the GPU for its forward and back to ``meta`` after it: a ``meta`` copy of a GPU tensor had been
counted as a GPU allocation (its input's device), so every offloaded layer stayed on the GPU."""

from __future__ import annotations

import pytest

from xmem_engine.tracing import trace

MIB = 1 << 20

META = """
import torch
x = torch.empty(1024, 1024, device="cuda")
a = torch.cuda.memory_allocated()
copies = [x.to("meta"), x.to(device=torch.device("meta")), torch.empty_like(x, device="meta"),
          torch.empty(4096, 4096, device="meta"), x.new_empty((2048, 2048), device="meta")]
b = torch.cuda.memory_allocated()
del x
c = torch.cuda.memory_allocated()
devices = sorted({t.device.type for t in copies})
with torch.device("meta"):
    y = torch.empty(4096, 4096)
z = torch.empty(100_000, 100_000, device="meta")  # 40 GB: no host memory either (real mode's guard)
d = torch.cuda.memory_allocated()
"""


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_meta_tensors_hold_no_memory(mode):
    ns: dict = {}
    trace(META, ns, mode=mode)
    assert ns["devices"] == ["meta"]
    assert (ns["a"], ns["b"], ns["c"], ns["d"]) == (4 * MIB, 4 * MIB, 0, 0)


OFFLOADED = """
import torch
layer = torch.nn.Linear(1024, 1024).cuda()
before = torch.cuda.memory_allocated()
with torch.no_grad():  # accelerate's set_module_tensor_to_device(layer, "weight", "meta")
    old = layer._parameters["weight"]
    layer._parameters["weight"] = type(old)(old.to("meta"), requires_grad=old.requires_grad)
    del old
after = torch.cuda.memory_allocated()
is_param, device = isinstance(layer.weight, torch.nn.Parameter), layer.weight.device.type
"""


def test_a_parameter_rebuilt_from_its_class_on_meta_frees_the_gpu_copy():
    ns: dict = {}
    trace(OFFLOADED, ns, mode="fake")
    assert ns["is_param"] and ns["device"] == "meta"
    assert ns["before"] - ns["after"] == 1024 * 1024 * 4
