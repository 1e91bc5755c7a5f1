"""gpus/cuda_libraries: what a CUDA run allocates that the CPU trace does not (cuBLAS / cuBLASLt workspaces)."""

import pytest

from xmem_engine.gpus import cuda_libraries as cb
from xmem_engine.gpus.cuda_libraries import LT_WORKSPACE_OP, WORKSPACE_OP, adapt_trace
from xmem_engine.estimate import estimate_trace
from xmem_engine.gpus import get_gpu
from xmem_engine.trace import ALLOC, FREE, Trace, TraceEvent

MiB = 1 << 20
A100 = get_gpu("A100-40GB")


def _linear_step() -> Trace:
    """Forward of two nn.Linear layers (addmm with bias) and their backward (mm), fp32."""
    ev: list[TraceEvent] = []

    def alloc(i, op, shape, phase, dtype="float32"):
        n = shape[0] * shape[1] * (2 if dtype in ("float16", "bfloat16") else 4)
        ev.append(TraceEvent(ALLOC, id=i, bytes=n, op=op, phase=phase, dtype=dtype, shape=shape,
                             category="activation"))

    alloc(1, "aten.addmm.default", (64, 2048), "forward")
    alloc(2, "aten.addmm.default", (64, 512), "forward")
    alloc(3, "aten.mm.default", (64, 2048), "backward")
    alloc(4, "aten.mm.default", (512, 2048), "backward")
    alloc(5, "aten.addmm.default", (1, 512), "forward")  # a 1-row input: not the Lt path
    alloc(6, "aten.addmm.default", (64, 512), "forward", dtype="complex64")  # nor a complex one
    for i in range(1, 7):
        ev.append(TraceEvent(FREE, id=i, bytes=0))
    return Trace(events=ev, mode="fake")


def _lt(events):
    return [(e.kind, e.bytes, e.phase) for e in events if e.op == LT_WORKSPACE_OP]


@pytest.mark.parametrize("text, expected", [
    ("2.6", (2, 6)), ("2.6.0+cu124", (2, 6)), ("2.13.0", (2, 13)), ("2.10.0a0+git1234", (2, 10)),
])
def test_version_parsing(text, expected):
    assert cb.parse_version(text) == expected


def test_version_parsing_default_and_garbage():
    import torch

    assert cb.parse_version(None) == tuple(int(x) for x in torch.__version__.split(".")[:2])
    with pytest.raises(ValueError, match="PyTorch version"):
        cb.parse_version("nightly")


@pytest.mark.parametrize("version, mode", [
    ("2.4", cb.PER_CALL), ("2.6.0+cu124", cb.PER_CALL), ("2.8.0", cb.PER_CALL),
    ("2.9.1", cb.PERSISTENT), ("2.11.0", cb.PERSISTENT), ("2.12", cb.UNIFIED), ("2.13.0", cb.UNIFIED),
])
def test_lt_mode_by_version(version, mode):
    assert cb.lt_workspace_mode(version, {}) == mode


def test_per_call_workspace_around_each_forward_addmm_in_old_versions():
    events, notes = adapt_trace(_linear_step(), A100, "2.6.0+cu124", environ={})
    # two fp32 addmm with rows and columns > 1: 1 MiB allocated and freed around each
    assert _lt(events) == [(ALLOC, MiB, "forward"), (FREE, MiB, "forward")] * 2
    first = [e.op for e in events[:5]]
    assert first == ["aten.addmm.default", LT_WORKSPACE_OP, WORKSPACE_OP, LT_WORKSPACE_OP, "aten.addmm.default"]
    ids = [e.id for e in events if e.op == LT_WORKSPACE_OP]
    assert ids[0] == ids[1] != ids[2] == ids[3]
    assert [e.bytes for e in events if e.op == WORKSPACE_OP] == [8_519_680, 8_519_680]  # unchanged
    assert any("cuBLASLt" in n for n in notes)


def test_persistent_workspace_once_in_2_9_to_2_11():
    events, _ = adapt_trace(_linear_step(), A100, "2.10.0", environ={})
    assert _lt(events) == [(ALLOC, MiB, "forward")]  # kept: no free, once per (thread, stream)


def test_nothing_extra_once_unified():
    base = [e.op for e in adapt_trace(_linear_step(), A100, "2.13.0", environ={})[0]]
    assert LT_WORKSPACE_OP not in base and base.count(WORKSPACE_OP) == 2


def test_a_step_with_convolutions_says_cudnn_workspaces_are_not_in_it():
    assert not any("cuDNN" in n for n in adapt_trace(_linear_step(), A100, "2.13.0", environ={})[1])
    conv = Trace(events=[TraceEvent(ALLOC, id=1, bytes=4096, op="aten.convolution.default", phase="forward"),
                         TraceEvent(FREE, id=1, bytes=0)], mode="fake")
    events, notes = adapt_trace(conv, A100, "2.13.0", environ={})
    assert [n for n in notes if "cuDNN convolution workspaces" in n] == [cb.CUDNN_NOTE]
    assert len(events) == 2  # a note, nothing added


def test_the_tracer_records_convolutions_once_for_every_gpu_switch():
    from xmem_engine.tracing import trace

    step = """
import torch
conv = torch.nn.Conv2d(3, 8, 3).cuda()
conv(torch.randn(2, 3, 16, 16, device="cuda")).sum().backward()
"""
    tr = trace(step, {}, mode="fake")
    assert tr.meta["convolutions"] is True
    assert trace("import torch\nx = torch.ones(8, device='cuda') * 2\n", {}, mode="fake").meta["convolutions"] is False
    tr.meta["convolutions"] = False  # what the tracer recorded is what a switch reads
    assert cb.CUDNN_NOTE not in adapt_trace(tr, A100, "2.13.0", environ={})[1]


def test_env_overrides():
    step = _linear_step()
    # CUBLASLT_WORKSPACE_SIZE is in KiB
    events, _ = adapt_trace(step, A100, "2.6", environ={"CUBLASLT_WORKSPACE_SIZE": "4096"})
    assert {b for _, b, _ in _lt(events)} == {4 * MiB}
    # the xMem evaluator's CUBLAS_WORKSPACE_CONFIG=:0:0 removes the cuBLAS workspace, not the Lt one...
    events, _ = adapt_trace(step, A100, "2.6", environ={"CUBLAS_WORKSPACE_CONFIG": ":0:0"})
    assert not [e for e in events if e.op == WORKSPACE_OP] and len(_lt(events)) == 4
    # ... except from 2.11, where the Lt size is capped by the cuBLAS one
    events, _ = adapt_trace(step, A100, "2.11", environ={"CUBLAS_WORKSPACE_CONFIG": ":0:0"})
    assert _lt(events) == []
    # TORCH_CUBLASLT_UNIFIED_WORKSPACE: opt-in from 2.8, opt-out from 2.12
    assert cb.lt_workspace_mode("2.8", {"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "1"}) == cb.UNIFIED
    assert cb.lt_workspace_mode("2.7", {"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "1"}) == cb.PER_CALL
    assert cb.lt_workspace_mode("2.13", {"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "0"}) == cb.PERSISTENT
    # DISABLE_ADDMM_CUDA_LT=1 sends addmm to plain cuBLAS
    events, _ = adapt_trace(step, A100, "2.6", environ={"DISABLE_ADDMM_CUDA_LT": "1"})
    assert _lt(events) == []


def test_blackwell_cublas_workspace_before_2_12():
    b200 = get_gpu("B200")
    assert b200.cublas_workspace_bytes == 32 * MiB
    assert cb.cublas_workspace_bytes(b200, {}, "2.11") == 8_519_680
    assert cb.cublas_workspace_bytes(b200, {}, "2.12") == 32 * MiB
    assert cb.cublas_workspace_bytes(get_gpu("H100"), {}, "2.4") == 32 * MiB


def test_simulated_peak_follows_the_version(monkeypatch):
    for var in ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE", "TORCH_CUBLASLT_UNIFIED_WORKSPACE",
                "DISABLE_ADDMM_CUDA_LT"):
        monkeypatch.delenv(var, raising=False)
    # the peak is at the forward addmm: its output, the cuBLAS workspace and (old versions) the Lt one
    step = Trace(events=[
        TraceEvent(ALLOC, id=1, bytes=4 * MiB, op="aten.addmm.default", phase="forward", dtype="float32",
                   shape=(1024, 1024), category="activation"),
        TraceEvent(FREE, id=1, bytes=4 * MiB),
    ], mode="fake")
    old = estimate_trace(step, "A100-40GB", torch_version="2.6.0")
    mid = estimate_trace(step, "A100-40GB", torch_version="2.10.0")
    new = estimate_trace(step, "A100-40GB", torch_version="2.13.0")
    assert new.peak_allocated_bytes == 4 * MiB + 8_519_680
    assert old.peak_allocated_bytes == mid.peak_allocated_bytes == new.peak_allocated_bytes + MiB
    assert old.peak_reserved_bytes == new.peak_reserved_bytes + 2 * MiB  # a small-pool segment
