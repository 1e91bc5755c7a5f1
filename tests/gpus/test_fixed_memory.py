"""The fixed memory of a training process per GPU (issue #37): its parts and their sources, which
parts a step pays (from its trace), the range they add where they were not measured, and the two
readings of the peak (nvidia-smi's used, and total - free with the driver's reserve)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from xmem_engine import gpus
from xmem_engine.calibration import load_calibration
from xmem_engine.estimate import estimate, estimate_trace
from xmem_engine.gpus import GPUCatalogError, load_catalog
from xmem_engine.gpus.cuda_libraries import library_bytes
from xmem_engine.gpus.fixed_memory import fixed_memory, libraries_used, parts
from xmem_engine.tracing import trace

MiB = 1 << 20

MLP = """
import torch, torch.nn as nn
model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
opt = torch.optim.AdamW(model.parameters())
for _ in range(2):
    x = torch.randn(64, 256, device="cuda")
    model(x).sum().backward(); opt.step(); opt.zero_grad()
"""
CNN = """
import torch, torch.nn as nn
model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU(), nn.Flatten(),
                      nn.Linear(16 * 30 * 30, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    x = torch.randn(8, 3, 32, 32, device="cuda")
    model(x).sum().backward(); opt.step(); opt.zero_grad()
"""
LSTM = """
import torch, torch.nn as nn
lstm = nn.LSTM(8, 16).cuda()
y, _ = lstm(torch.randn(5, 2, 8, device="cuda"))
y.sum().backward()
"""
DDP = """
import torch, torch.distributed as dist
dist.init_process_group("nccl")
x = torch.ones(1 << 20, device="cuda")
dist.all_reduce(x)
dist.destroy_process_group()
"""


@pytest.fixture(autouse=True)
def no_user_catalog(monkeypatch, tmp_path):
    monkeypatch.delenv(gpus.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


@pytest.fixture(scope="module")
def traces():
    return {name: trace(src, {}, mode="fake") for name, src in (("mlp", MLP), ("cnn", CNN), ("lstm", LSTM))}


# ------------------------------------------------------------------ the parts, per class of GPU

# (GPU, parts measured on it): the paper's consumer GPUs were measured by its runs (context,
# kernels, and no cuDNN offset); two more consumer GPUs have a measured bare context; every
# datacenter GPU has none measured.
CLASSES = [
    ("RTX-3060-12GB", {"context_bytes", "kernel_bytes", "cudnn_bytes"}),
    ("RTX-4060-8GB", {"context_bytes", "kernel_bytes", "cudnn_bytes"}),
    ("RTX-3090", {"context_bytes"}),
    ("RTX-6000-ADA", {"context_bytes"}),
    ("T4", set()),
    ("A100-SXM4-40GB", set()),
    ("L40S", set()),
    ("H100-SXM-80GB", set()),
    ("H200", {"context_bytes", "kernel_bytes", "cudnn_bytes"}),  # benchmarks/data/fixed_memory-nvidia-h200-*
    ("B200", set()),
]


@pytest.mark.parametrize("key,measured", CLASSES, ids=[c[0] for c in CLASSES])
def test_each_gpu_class_shows_its_fixed_memory_parts_and_sources(catalog, key, measured):
    gpu = catalog[key]
    shown = {p.name: p for p in parts(gpu)}
    assert list(shown) == ["context_bytes", "kernel_bytes", "cudnn_bytes", "nccl_bytes"]
    for name, p in shown.items():
        assert p.bytes == getattr(gpu, name) and p.low_bytes <= p.bytes <= p.high_bytes
        assert p.measured == (name in measured), name
        # a source a reader can follow: a public document, the paper's data, this repository's own
        # measurement on the GPU, or an estimate that says how
        assert len(p.source) > 40 and ("http" in p.source or "xMem paper data" in p.source
                                       or "benchmarks/data/fixed_memory-" in p.source), (name, p.source)
        if p.measured:
            assert (p.low_bytes, p.high_bytes) == (p.bytes, p.bytes) and not p.range_source
        else:
            assert p.source.startswith(("estimated: ", "assumed: ")), (name, p.source)
            assert p.high_bytes > p.bytes and p.range_source.startswith(("estimated: ", "assumed: ")), name
    # NCCL is measured on no GPU: its memory depends on the topology and the number of ranks
    assert shown["nccl_bytes"].bytes == gpus.catalog.DEFAULT_NCCL_BYTES
    assert "https://github.com/NVIDIA/nccl/issues/964" in shown["nccl_bytes"].source


def test_the_driver_reserve_is_sourced_per_gpu(catalog):
    """NVML's Reserved: nvidia-smi -q figures where found (the H100's spans its drivers), else
    the catalog's nvidia-smi total less totalGlobalMem; unknown without an nvidia-smi total."""
    h100, l40s = catalog["H100-SXM-80GB"], catalog["L40S"]
    assert h100.driver_reserved_bytes == 81_559 * MiB - h100.total_memory_bytes  # 480 MiB
    assert h100.part_range("driver_reserved_bytes") == (328 * MiB, 551 * MiB)
    assert "thamada/nvidia-smi" in h100.sources["driver_reserved_bytes_range"]
    assert l40s.part_range("driver_reserved_bytes") == (479 * MiB, l40s.driver_reserved_bytes)
    assert catalog["A100-PCIE-40GB"].driver_reserved_bytes is None  # no nvidia-smi total found
    for key, gpu in catalog.items():
        if gpu.driver_reserved_bytes is not None:
            assert 0 <= gpu.driver_reserved_bytes < 1 << 30, key
            assert len(gpu.sources["driver_reserved_bytes"]) > 40, key


# ------------------------------------------------------------------ which parts a step pays

def test_the_trace_says_which_libraries_a_step_initialises(traces):
    assert libraries_used(traces["mlp"]) == {"kernels"}
    assert libraries_used(traces["cnn"]) == {"kernels", "cudnn"}  # convolution, batch norm
    assert libraries_used(traces["lstm"]) == {"kernels", "cudnn"}  # decomposed while tracing: its module
    assert libraries_used(trace("import torch\nx = 1 + 1\n", {}, mode="fake")) == frozenset()


def test_a_process_group_of_several_ranks_pays_nccl():
    from xmem_engine.tracing.shims.distributed import World, available

    if not available():
        pytest.skip("this torch build has no torch.distributed")
    assert libraries_used(trace(DDP, {}, mode="fake", world=World(4))) == {"kernels", "nccl"}
    assert "nccl" not in libraries_used(trace(DDP, {}, mode="fake", world=World(1)))
    est = estimate(DDP, "H100", world=World(4))
    h100 = est.target
    assert est.outside_allocator_bytes == h100.kernel_bytes + h100.nccl_bytes
    assert any(n.startswith("NCCL's communicator, outside PyTorch's allocator, is included") for n in est.notes)
    assert not any(n.startswith("not included: NCCL") for n in est.notes)  # the tracer's note, superseded
    # a rank of a world that never makes a process group pays no NCCL
    alone = estimate("import torch\nx = torch.ones(4, device='cuda')\n", "H100", world=World(4))
    assert alone.outside_allocator_bytes == h100.kernel_bytes and not alone.fixed_memory.nccl_note()


def test_the_libraries_a_step_pays_are_outside_the_allocator(catalog, traces, tmp_path):
    """cuDNN's memory is paid by a convolutional step only: with a catalog figure for it, the CNN's
    peak and allocator limit move by exactly that much; the MLP's do not."""
    f = tmp_path / "gpus.toml"
    f.write_text('[gpus."L40S"]\ncudnn_bytes = 100_000_000\n')
    l40s = catalog["L40S"]
    mine = load_catalog(f)["L40S"]
    for name, extra in (("cnn", 100_000_000), ("mlp", 0)):
        base, more = estimate_trace(traces[name], l40s), estimate_trace(traces[name], mine)
        assert library_bytes(mine, traces[name]) - library_bytes(l40s, traces[name]) == extra
        assert more.outside_allocator_bytes - base.outside_allocator_bytes == extra
        assert more.peak_device_bytes - base.peak_device_bytes == extra
        assert base.allocator_limit_bytes - more.allocator_limit_bytes == extra
    assert fixed_memory(mine, traces["cnn"]).bytes == mine.context_bytes + mine.kernel_bytes + 100_000_000


# ------------------------------------------------------------------ the range

needs_calibration = pytest.mark.skipif(load_calibration() is None, reason="no xmem_engine/data/calibration.json")


@needs_calibration
def test_the_h100_range_is_wider_than_the_rtx3060s_by_the_unmeasured_part(traces):
    """A convolutional step's calibrated spread is in units of its largest convolution tensor, the
    same on both GPUs: the H100's range is wider by exactly what its unmeasured fixed memory may
    be off, the RTX 3060's (measured by the calibration runs) by nothing."""
    h100, rtx = estimate_trace(traces["cnn"], "H100"), estimate_trace(traces["cnn"], "RTX-3060-12GB")
    fixed = h100.fixed_memory
    assert {p.name for p in fixed.unmeasured} == {"context_bytes", "kernel_bytes", "cudnn_bytes"}
    assert not rtx.fixed_memory.unmeasured and rtx.peak_range.fixed_above_bytes == 0
    width = lambda e: e.peak_range.high_bytes - e.peak_range.low_bytes  # noqa: E731
    step_width = lambda e: e.peak_range.step_high_bytes - e.peak_range.step_low_bytes  # noqa: E731
    assert step_width(h100) == step_width(rtx)
    assert width(h100) - width(rtx) == fixed.below_bytes + fixed.above_bytes > 300 * MiB
    assert h100.peak_range.high_bytes == h100.peak_range.step_high_bytes + fixed.above_bytes
    assert fixed.above_bytes == (170 + 108 + 162) * MiB  # context +170, kernels up to 3x 54, cuDNN up to 162
    assert "fixed memory not measured on this GPU: CUDA context" in h100.range_text
    assert "fixed memory not measured" not in rtx.range_text


@needs_calibration
def test_a_measured_figure_narrows_the_range_and_safe_follows_the_high_end(traces, tmp_path):
    """Measuring the H100's context (a user file: the figure is theirs) takes its +-170 MiB out
    of the range; --safe judges by the wider high end of the unmeasured GPU."""
    h100 = estimate_trace(traces["mlp"], "H100")
    f = tmp_path / "gpus.toml"
    f.write_text('[gpus."H100-SXM-80GB"]\ncontext_bytes = 600_000_000\n')
    measured = estimate_trace(traces["mlp"], load_catalog(f)["H100-SXM-80GB"])
    assert h100.peak_range.fixed_above_bytes - measured.peak_range.fixed_above_bytes == 170 * MiB
    assert h100.safe_bytes == h100.peak_range.high_bytes > h100.peak_device_bytes + 170 * MiB
    # the point moves with the measured figure, the step's own spread does not
    assert measured.peak_device_bytes - h100.peak_device_bytes == 600_000_000 - h100.context_bytes


# ------------------------------------------------------------------ the two readings

def test_both_readings_are_named_in_the_text_json_and_report(traces):
    est = estimate_trace(traces["mlp"], "H100")
    reserve = est.target.driver_reserved_bytes
    readings = est.readings
    assert readings.driver_reserved_bytes == reserve and readings.nvidia_smi_bytes == est.peak_device_bytes
    assert readings.total_minus_free_bytes == est.peak_device_bytes + reserve
    j = est.to_json()
    assert j["driver_reserved_bytes"] == reserve
    assert j["peak_total_minus_free_bytes"] == est.peak_device_bytes + reserve
    if est.peak_range is not None:
        assert j["peak_total_minus_free_bytes_high"] == est.peak_range.high_bytes + 551 * MiB
        assert j["peak_total_minus_free_bytes_low"] == est.peak_range.low_bytes + 328 * MiB
    assert [p["name"] for p in j["fixed_memory"]["parts"]] == ["context_bytes", "kernel_bytes"]
    assert j["fixed_memory"]["driver_reserved"]["bytes"] == reserve
    text = est.summary()
    assert "readings: nvidia-smi used" in text and "total - free (NVML v1 used" in text
    assert readings.describe() == j["readings"] == est.to_report()["readings"]
    # a GPU without a known reserve says so instead of guessing
    bare = estimate_trace(traces["mlp"], dataclasses.replace(est.target, driver_reserved_bytes=None))
    assert bare.readings.total_minus_free_bytes is None and bare.to_json()["peak_total_minus_free_bytes_high"] is None
    assert "unknown" in bare.readings.describe()


# ------------------------------------------------------------------ bad catalog input

def _user(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "gpus.toml"
    f.write_text(text)
    return f


@pytest.mark.parametrize("text,words", [
    ('[gpus.T4]\ncontext_bytes_range = [1, 2, 3]\n', ["'context_bytes_range'", "[low, high]"]),
    ('[gpus.T4]\ncontext_bytes_range = [5, 1]\n', ["'context_bytes_range'", "low <= high"]),
    ('[gpus.T4]\nkernel_bytes_range = [-1, 5]\n', ["'kernel_bytes_range'", "[low, high]"]),
    ('[gpus.T4]\nnccl_bytes_range = ["a", "b"]\n', ["'nccl_bytes_range'", "[low, high]"]),
    ('[gpus.T4]\ncontext_bytes_range = 5\n', ["'context_bytes_range'", "must be a list"]),
    ('[gpus.T4]\ncontext_bytes_range = [1, 2]\n', ["'context_bytes_range'", "does not contain context_bytes"]),
    ('[gpus."A100-PCIE-40GB"]\ndriver_reserved_bytes_range = [1, 2]\n',
     ["'driver_reserved_bytes_range'", "does not have"]),
    ('[gpus.T4]\nnvidia_smi_memory_mib = 1000\n', ["nvidia_smi_memory_mib", "cannot be the smaller"]),
    ('[gpus.T4]\ncudnn_byte = 5\n', ["'cudnn_byte' is unknown", "did you mean 'cudnn_bytes'"]),
])
def test_malformed_fixed_memory_entries_get_a_specific_error(tmp_path, text, words):
    with pytest.raises(GPUCatalogError) as info:
        load_catalog(_user(tmp_path, text))
    for w in words:
        assert w in str(info.value), str(info.value)


def test_overriding_a_figure_drops_the_catalogs_range_for_it(catalog, tmp_path):
    mine = load_catalog(_user(tmp_path, '[gpus."H100-SXM-80GB"]\ndriver_reserved_bytes = 500_000_000\n'))
    gpu = mine["H100-SXM-80GB"]
    assert gpu.part_range("driver_reserved_bytes") == (500_000_000, 500_000_000)
    assert "driver_reserved_bytes_range" not in gpu.sources
    ranged = load_catalog(_user(tmp_path, '[gpus.T4]\ncontext_bytes = 500_000_000\n'
                                          'context_bytes_range = [400_000_000, 700_000_000]\n'))["T4"]
    assert ranged.part_range("context_bytes") == (400_000_000, 700_000_000)
    assert ranged.measured("context_bytes")  # the user's figure, with the user's own range


# ------------------------------------------------------------------ the CLI

def test_the_cli_names_both_readings_and_the_parts(tmp_path, capsys):
    import json

    from xmem_engine.cli import main

    assert main(["gpus"]) == 0
    out = capsys.readouterr().out
    assert "driver reserve MiB" in out and "~: not measured on that GPU" in out
    h100_row = next(line for line in out.splitlines() if line.startswith("H100-SXM-80GB"))
    assert "426~" in h100_row and "688~" in h100_row
    assert main(["gpus", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    names = [p["name"] for p in data["H100-SXM-80GB"]["fixed_memory"]]
    assert names == ["context_bytes", "kernel_bytes", "cudnn_bytes", "nccl_bytes", "driver_reserved_bytes"]
    script = tmp_path / "train.py"
    script.write_text(MLP)
    assert main(["estimate", str(script), "--gpu", "H100"]) == 0
    text = capsys.readouterr().out
    assert "readings: nvidia-smi used" in text and "total - free (NVML v1 used" in text
    assert "fixed memory (MiB): CUDA context 426" in text
    assert main(["estimate", str(script), "--gpu", "H100", "--json"]) == 0
    j = json.loads(capsys.readouterr().out)
    assert j["peak_total_minus_free_bytes"] == j["peak_device_bytes"] + j["driver_reserved_bytes"]
