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


def test_compiled_float8_matmuls_stay_in_fake_mode(monkeypatch):
    """Inductor writes float8 matmuls as ``_scaled_mm(..., out=buf)``, an overload with no
    Meta kernel: FakeTensorMode ran each for real on the CPU (39 of 59 s of a 2-layer Llama,
    and 16 GiB of host memory for 22 layers) until ``out_metas.py`` answered for it."""
    import torch._subclasses.fake_tensor as fake_tensor

    from xmem_engine.tracing import trace

    fallbacks: list[str] = []
    real_fallback = fake_tensor.run_fallback_kernel

    def counted(fake_mode, func, *args, **kwargs):
        fallbacks.append(str(func))
        return real_fallback(fake_mode, func, *args, **kwargs)

    monkeypatch.setattr(fake_tensor, "run_fallback_kernel", counted)
    compiled = STEP.replace("convert_to_float8_training(model)\n",
                            "convert_to_float8_training(model)\nmodel = torch.compile(model)\n")
    tr = trace(compiled, {}, mode="fake", device={"name": "NVIDIA H100 80GB HBM3", "major": 9, "minor": 0})
    assert any("compiled for the target GPU" in n for n in tr.meta["notes"]), tr.meta["notes"]
    assert not any("_scaled_mm" in f for f in fallbacks), fallbacks
    assert tr.meta["iterations"] >= 2


OFFLOADED = """
import torch
from torchao.optim import CPUOffloadOptimizer
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)).cuda()
opt = CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW, offload_gradients=True, fused=True)
for _ in range(2):
    model(torch.randn(64, 512, device="cuda")).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
"""


def test_cpu_offload_optimizer_keeps_states_and_large_gradients_off_the_gpu():
    """torchao's ``CPUOffloadOptimizer`` is an Optimizer that never calls
    ``Optimizer.__init__`` (no ``state``): the tracer's classification of what an optimizer
    holds stopped the estimate with an AttributeError."""
    from xmem_engine.tracing import trace

    fake = trace(OFFLOADED, {}, mode="fake")
    real = trace(OFFLOADED, {}, mode="real")
    assert fake.mode == "fake"
    sizes = [[(e.kind, e.bytes) for e in tr.events if e.kind in ("alloc", "free")] for tr in (fake, real)]
    assert sizes[0] == sizes[1]
    cuda = [e for e in fake.events if e.kind == "alloc"]
    # the weights' AdamW states live on the host: on the GPU only the biases' (under 4,096
    # elements, torchao's minimal_size, stepped by an on-device AdamW)
    states = sorted(e.bytes for e in cuda if e.category == "optimizer_state")
    assert states and max(states) <= 1024 * 4, states
    # each weight's gradient, freed in the backward once copied to the host, is still a gradient
    grads = [e.bytes for e in cuda if e.category == "gradient" and e.bytes == 512 * 1024 * 4]
    assert len(grads) == 4  # two weights, two steps
