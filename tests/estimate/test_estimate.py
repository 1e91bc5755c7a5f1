"""The estimate: trace -> CUDA behaviour -> allocator on the target GPU -> plain result."""

import json

import pytest

from xmem_engine.gpus.cuda_libraries import WORKSPACE_OP
from xmem_engine.estimate import Estimate, estimate, estimate_trace, max_batch
from xmem_engine.gpus import UnknownGPUError

MiB = 1 << 20

MLP = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512)).cuda()
opt = torch.optim.AdamW(model.parameters())
for _ in range(2):
    x = torch.randn(batch, 512, device="cuda")
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.fixture(scope="module")
def mlp_estimate() -> Estimate:
    return estimate(MLP, "A100-40GB", namespace={"batch": 64}, mode="fake")


def test_headline_figures_add_up(mlp_estimate):
    e = mlp_estimate
    assert e.gpu == "A100-SXM4-40GB" and e.fits and not e.oom
    assert e.peak_device_bytes == e.context_bytes + e.outside_allocator_bytes + e.peak_reserved_bytes
    assert e.headroom_bytes == e.capacity_bytes - e.peak_device_bytes
    assert e.peak_allocated_bytes <= e.peak_reserved_bytes
    params = 2 * (512 * 2048 * 4) + 2048 * 4 + 512 * 4
    # AdamW keeps two moments per parameter; gradients as big as the parameters
    assert e.breakdown["parameter"] >= params
    assert e.breakdown["optimizer_state"] >= 2 * params
    assert set(e.breakdown) <= {"parameter", "gradient", "optimizer_state", "activation", "temporary", "input",
                                "workspace", "buffer", "other"}
    assert e.timeline.allocated and max(e.timeline.allocated) == e.peak_allocated_bytes


def test_kernel_memory_is_the_gpus_figure_and_leaves_the_allocator_less(mlp_estimate):
    """Kernels loaded during the step count on the device, beside (not inside) the allocator."""
    from dataclasses import replace

    from xmem_engine.gpus import get_gpu

    a100 = get_gpu("A100-40GB")
    assert mlp_estimate.outside_allocator_bytes == a100.kernel_bytes > 0
    assert mlp_estimate.allocator_limit_bytes == a100.total_memory_bytes - a100.context_bytes - a100.kernel_bytes
    bare = estimate_trace(mlp_estimate.trace, replace(a100, kernel_bytes=0))
    assert bare.outside_allocator_bytes == 0
    assert bare.peak_reserved_bytes == mlp_estimate.peak_reserved_bytes
    assert mlp_estimate.peak_device_bytes - bare.peak_device_bytes == a100.kernel_bytes


def test_a_step_that_puts_nothing_on_the_gpu_loads_no_kernels():
    e = estimate("import torch\nx = torch.ones(4) * 2\n", "A100-40GB", namespace={}, mode="fake")
    assert e.peak_reserved_bytes == 0 and e.outside_allocator_bytes == 0


def test_two_cublas_workspaces_sized_by_architecture(mlp_estimate):
    ws = [ev for ev in estimate_trace(mlp_estimate.trace, "A100-40GB").trace.events if ev.op == WORKSPACE_OP]
    assert ws == []  # the trace itself stays GPU-independent
    from xmem_engine.gpus.cuda_libraries import adapt_trace
    from xmem_engine.gpus import get_gpu

    for gpu, size in (("A100-40GB", 8_519_680), ("H100", 32 * MiB)):
        events, _ = adapt_trace(mlp_estimate.trace, get_gpu(gpu), "2.6")
        sizes = [ev.bytes for ev in events if ev.op == WORKSPACE_OP]
        assert sizes == [size, size]  # forward thread + autograd thread
        phases = [ev.phase for ev in events if ev.op == WORKSPACE_OP]
        assert phases[0] != "backward" and phases[1] == "backward"


def test_gpu_switch_resimulates_without_retracing(mlp_estimate):
    h100 = estimate_trace(mlp_estimate.trace, "h100")
    assert h100.gpu == "H100-SXM-80GB" and h100.trace is mlp_estimate.trace
    # 2 x (32 MiB - 8,519,680 B) more workspace on Hopper
    assert h100.peak_allocated_bytes - mlp_estimate.peak_allocated_bytes == 2 * (32 * MiB - 8_519_680)
    assert h100.trace_seconds == mlp_estimate.trace_seconds  # the same trace, not traced again
    assert mlp_estimate.resimulate("h100").to_json() | {"seconds": 0, "simulate_seconds": 0} == \
        h100.to_json() | {"seconds": 0, "simulate_seconds": 0}


def test_does_not_fit_on_a_small_gpu():
    e = estimate(MLP, "RTX 4060", namespace={"batch": 300_000}, mode="fake")
    assert not e.fits and e.headroom_bytes < 0
    assert e.oom and any("out of memory" in n for n in e.notes)


def test_unknown_gpu_is_a_clear_error():
    with pytest.raises(UnknownGPUError, match="A100"):
        estimate(MLP, "A100-41GB-imaginary", namespace={"batch": 1})


def test_report_is_json_and_thinned(mlp_estimate):
    rep = mlp_estimate.to_report(max_points=10)
    json.dumps(rep)
    assert rep["version"] == 1 and rep["gpu"] == "A100-SXM4-40GB"
    assert len(rep["timeline"]["event"]) <= 10
    assert max(rep["timeline"]["allocated"]) == mlp_estimate.peak_allocated_bytes  # the peak survives


class _Fake:
    def __init__(self, fits: bool):
        self.fits = fits


@pytest.mark.parametrize("answer, start", [(37, 1), (37, 64), (1, 8), (1000, 1000), (0, 5)])
def test_max_batch_search(answer, start):
    calls = []

    def build(v):
        calls.append(v)
        return _Fake(v <= answer)

    best, est = max_batch(build, start=start)
    assert best == answer
    assert len(calls) == len(set(calls))  # each value estimated once
    assert len(calls) <= 2 * max(answer, start).bit_length() + 2


AMP = """
import torch
model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)]).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(4096, 256, device="cuda")
with torch.autocast("cuda", dtype=torch.bfloat16, enabled=AMP_ON):
    loss = model(x).float().square().mean()
loss.backward()
opt.step()
"""


def test_autocast_cuda_halves_the_saved_activations():
    on = estimate(AMP, "A100-40GB", namespace={"AMP_ON": True}, mode="fake")
    off = estimate(AMP, "A100-40GB", namespace={"AMP_ON": False}, mode="fake")
    # the Linear layers save bfloat16 inputs instead of float32 ones (the final .float() and
    # the weight casts are the same either way): 16.0 MiB of activations become 12.4 MiB
    assert on.breakdown["activation"] <= 0.8 * off.breakdown["activation"]
    dtypes = {ev.dtype for ev in on.trace.events if ev.kind == "alloc" and ev.op == "aten.mm.default"}
    assert "bfloat16" in dtypes


DROPOUT = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Dropout(0.1), torch.nn.Linear(512, 512)).cuda()
loss = model(torch.randn(1024, 512, device="cuda")).square().mean()
loss.backward()
"""


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_dropout_saves_a_bool_mask_as_on_cuda(mode):
    e = estimate(DROPOUT, "A100-40GB", namespace={}, mode=mode)
    masks = [ev for ev in e.trace.events if ev.kind == "alloc" and ev.op.startswith("aten.native_dropout.")]
    assert sorted(ev.dtype for ev in masks) == ["bool", "float32"]  # the output and a 1-byte mask
    assert min(ev.bytes for ev in masks) == 1024 * 512


# Frees a large block, then asks for slightly larger ones: the natural run keeps the first
# segment cached beside new ones, a capped run frees it and fits in far less.
CACHE_HEAVY = """
import torch
a = torch.empty(100 * 2**20, dtype=torch.uint8, device="cuda")
keep = torch.empty(30 * 2**20, dtype=torch.uint8, device="cuda")
del a
b = torch.empty(110 * 2**20, dtype=torch.uint8, device="cuda")
"""


def test_minimum_memory_is_the_least_limit_the_simulated_run_completes_in():
    from xmem_engine.simulation.alloc_conf import AllocatorConfig
    from xmem_engine.simulation.allocator import CachingAllocator
    from xmem_engine.gpus.cuda_libraries import adapt_trace
    from xmem_engine.resimulation import SEGMENT_GRANULE, minimum_memory
    from xmem_engine.gpus import get_gpu
    from xmem_engine.simulation.simulate import simulate

    e = estimate(CACHE_HEAVY, "A100-40GB", mode="fake")
    least = minimum_memory(e)
    extra = e.context_bytes + e.outside_allocator_bytes
    assert e.peak_reserved_bytes == (100 + 30 + 110) * MiB  # the 100 MiB segment stays cached
    assert least - extra == (30 + 110) * MiB  # capped, it is freed for the 110 MiB one
    events, _ = adapt_trace(e.trace, get_gpu(e.gpu), e.torch_version)

    def runs(limit):
        return not simulate(events, allocator=CachingAllocator(AllocatorConfig(), capacity=limit)).oom

    assert runs(least - extra) and not runs(least - extra - SEGMENT_GRANULE)


def test_minimum_memory_of_a_training_step_lies_between_its_allocated_and_natural_peaks(mlp_estimate):
    from xmem_engine.resimulation import minimum_memory

    least = minimum_memory(mlp_estimate)
    extra = mlp_estimate.context_bytes + mlp_estimate.outside_allocator_bytes
    assert mlp_estimate.peak_allocated_bytes <= least - extra <= mlp_estimate.peak_reserved_bytes
    assert mlp_estimate.min_device_bytes is None  # only on request


def test_modules_are_named_with_their_class():
    e = estimate("""
import torch
class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(256, 1024)
        self.fc2 = torch.nn.Linear(1024, 256)
    def forward(self, x):
        return self.fc2(self.fc1(x).relu())
model = torch.nn.Sequential(Block(), Block()).cuda()
model(torch.randn(512, 256, device="cuda")).sum().backward()
""", "T4", mode="fake")
    assert "0.fc1 (Linear)" in e.breakdown_by_module and "1.fc2 (Linear)" in e.breakdown_by_module
    assert "(no module)" not in e.breakdown_by_module
