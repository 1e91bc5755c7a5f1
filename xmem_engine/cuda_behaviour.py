"""What a CUDA run allocates that the same code traced on the CPU does not.

The tracer records the requests of a CPU run of the user's code (with the CUDA choices it can
make at trace time already made: see tracer.py). What depends on the *target GPU* is added
here, so that switching GPUs re-simulates the same trace without re-tracing:

* cuBLAS workspaces. PyTorch gives each (cuBLAS handle, stream) a workspace from the caching
  allocator at its first GEMM and keeps it for the life of the process. The autograd engine
  runs backward on its own thread, with its own handle, so a training step holds two:
  2 x 8,519,680 B (``CUBLAS_WORKSPACE_CONFIG=:4096:2:16:8``) on most GPUs, 2 x 32 MiB on
  sm90+ (the catalog's ``cublas_workspace_bytes``). The real recordings in
  ../shared/allocator-traces show exactly these blocks, allocated right after the output
  of the first GEMM of the forward and of the backward pass.
* Library memory outside the allocator (:func:`library_bytes`): kernels of cuBLAS and
  cuDNN loaded on first use, which nvidia-smi counts but the allocator never sees.
"""

from __future__ import annotations

import os
import re

from xmem_engine.gpus import GPU
from xmem_engine.trace import ALLOC, Trace, TraceEvent

# aten ops that run on cuBLAS on a GPU (names without overload).
GEMM_OPS = frozenset({
    "aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.addbmm", "aten.matmul", "aten.dot",
    "aten.vdot", "aten.mv", "aten.addmv", "aten.addr", "aten.linear", "aten._addmm_activation",
    "aten._scaled_mm", "aten._int_mm", "aten.einsum", "aten.tensordot",
})
CONV_OPS = frozenset({
    "aten.convolution", "aten._convolution", "aten.cudnn_convolution", "aten.conv2d", "aten.conv1d",
    "aten.conv3d", "aten.convolution_backward", "aten.cudnn_convolution_transpose", "aten.conv_transpose2d",
})
WORKSPACE_OP = "cublas.workspace"

# Library kernel memory outside the allocator, loaded lazily on first use (CUDA >= 11.7).
# Not calibrated yet: on ../shared/groundtruth the residuals show no common offset to fit
# (README, "Accuracy on real GPU runs"), so both stay 0 until a GPU measurement isolates them.
CUBLAS_LIBRARY_BYTES = 0
CUDNN_LIBRARY_BYTES = 0


def cublas_workspace_bytes(gpu: GPU, environ: dict | None = None) -> int:
    """The workspace per cuBLAS handle: ``CUBLAS_WORKSPACE_CONFIG`` when set (``:SIZE_KiB:COUNT``
    pairs, summed as PyTorch's ``parseChosenWorkspaceSize`` does), else the GPU's default."""
    env = os.environ if environ is None else environ
    text = env.get("CUBLAS_WORKSPACE_CONFIG")
    if not text:
        return gpu.cublas_workspace_bytes
    pairs = re.findall(r":(\d+):(\d+)", text)
    if not pairs:
        return gpu.cublas_workspace_bytes  # PyTorch ignores a config it cannot parse too
    return sum(int(size) * 1024 * int(count) for size, count in pairs)


def op_name(op: str) -> str:
    """``aten.mm.default`` -> ``aten.mm``."""
    parts = op.split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else op


def uses(trace: Trace | list[TraceEvent], ops: frozenset[str]) -> bool:
    events = trace.events if isinstance(trace, Trace) else trace
    return any(e.kind == ALLOC and op_name(e.op) in ops for e in events)


def adapt_trace(trace: Trace, gpu: GPU, torch_version: str) -> tuple[list[TraceEvent], list[str]]:
    """The trace's events as they would be on ``gpu``, plus notes on what was added."""
    events = list(trace.events)
    size = cublas_workspace_bytes(gpu)
    notes = [] if size == gpu.cublas_workspace_bytes else [f"cuBLAS workspace {size} B from CUBLAS_WORKSPACE_CONFIG"]
    if size == 0:
        return events, notes
    return _insert_workspaces(events, size), notes


def _insert_workspaces(events: list[TraceEvent], size: int) -> list[TraceEvent]:
    """Add a workspace after the first GEMM output of the forward thread and of backward."""
    out: list[TraceEvent] = []
    seen: set[tuple[str, int]] = set()
    next_id = max((e.id for e in events), default=0) + 1
    for e in events:
        out.append(e)
        if e.kind != ALLOC or op_name(e.op) not in GEMM_OPS:
            continue
        thread = "backward" if e.phase == "backward" else "main"
        key = (thread, e.stream)
        if key in seen:
            continue
        seen.add(key)
        out.append(TraceEvent(ALLOC, id=next_id, bytes=size, stream=e.stream,
                              category="workspace", op=WORKSPACE_OP, module=e.module, phase=e.phase,
                              dtype="uint8", shape=(size,), source=e.source,
                              iteration=e.iteration))
        next_id += 1
    return out


def library_bytes(gpu: GPU, trace: Trace | list[TraceEvent]) -> int:
    """Device memory the run's libraries take outside the caching allocator."""
    total = 0
    # Each check scans the whole trace (on every GPU switch): skip it when it cannot add.
    if CUBLAS_LIBRARY_BYTES and uses(trace, GEMM_OPS):
        total += CUBLAS_LIBRARY_BYTES
    if CUDNN_LIBRARY_BYTES and uses(trace, CONV_OPS):
        total += CUDNN_LIBRARY_BYTES
    return total
