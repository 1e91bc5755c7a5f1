"""What a CUDA run allocates that the same code traced on the CPU does not.

The tracer records the requests of a CPU run of the user's code (with the CUDA choices it can
make at trace time already made: see ``xmem_engine/tracing/``). What depends on the *target GPU* and on the
*PyTorch version* is added here, so that switching either re-simulates the same trace without
re-tracing:

* cuBLAS workspaces. PyTorch gives each (cuBLAS handle, stream) a workspace from the caching
  allocator at its first GEMM and keeps it for the life of the process. The autograd engine
  runs backward on its own thread, with its own handle, so a training step holds two:
  2 x 8,519,680 B (``CUBLAS_WORKSPACE_CONFIG=:4096:2:16:8``) on most GPUs, 2 x 32 MiB on
  sm90+ (the catalog's ``cublas_workspace_bytes``; sm100/sm120 only from PyTorch 2.12, PR
  #175344). The real recordings in ../shared/allocator-traces show exactly these blocks,
  allocated right after the output of the first GEMM of the forward and of the backward pass.
* cuBLASLt workspaces (:data:`LT_WORKSPACE_MODES`). ``addmm`` with a 1-D bias (``nn.Linear``
  forward), ``_addmm_activation`` and ``_scaled_mm`` run ``cublasLtMatmul``, whose workspace
  (``CUBLASLT_WORKSPACE_SIZE`` KiB, default 1024) was allocated and freed around every call
  up to PyTorch 2.8, is kept per (handle, stream) in 2.9-2.11, and is the cuBLAS workspace
  itself from 2.12 (``TORCH_CUBLASLT_UNIFIED_WORKSPACE`` opts in from 2.8, out from 2.12).
  Backward GEMMs are plain ``mm`` and never take this path.
* cuDNN convolution workspaces (``cudnn.py``): measured per architecture, asked for after each
  convolution the tracer recorded, dropped when the device cannot give them.
* cuFFT's plan workspaces are not added (their size is cuFFT's): a note says so.
* Library memory outside the allocator (:func:`library_bytes`): the kernels a step loads on
  first use (PyTorch's, cuBLAS's), cuDNN's once it runs, NCCL's once a process group exists,
  which nvidia-smi counts but the allocator never sees (``fixed_memory.py``).
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from typing import Iterable

from xmem_engine.gpus import cudnn
from xmem_engine.gpus.catalog import GPU
from xmem_engine.trace import ALLOC, FREE, Trace, TraceEvent

# aten ops that run on cuBLAS on a GPU (names without overload).
GEMM_OPS = frozenset({
    "aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.addbmm", "aten.matmul", "aten.dot",
    "aten.vdot", "aten.mv", "aten.addmv", "aten.addr", "aten.linear", "aten._addmm_activation",
    "aten._scaled_mm", "aten._int_mm", "aten.einsum", "aten.tensordot",
})
# aten ops (name prefixes) that run cuDNN convolutions on a GPU, whose workspaces come from
# measurements (gpus/cudnn.py): convolution, convolution_backward, _convolution, cudnn_convolution(_transpose).
CONV_OP_PREFIXES = ("aten.convolution", "aten._convolution", "aten.cudnn_convolution")
CUDNN_NOTE = cudnn.NOT_INCLUDED
FFT_OP_PREFIX = "aten._fft_"
CUFFT_NOTE = ("not included: cuFFT's plan workspaces (cuFFT sizes one for each plan on the GPU itself, and "
              "PyTorch allocates it around every transform through the caching allocator); the copies "
              "cuFFT's transforms make of their inputs are included")
WORKSPACE_OP = "cublas.workspace"
LT_WORKSPACE_OP = "cublaslt.workspace"

# aten ops that run cublasLtMatmul (Blas.cpp addmm_out_cuda_impl -> gemm_and_bias when
# isInputCompliesAddmmCudaLt / useLtInterface holds; _scaled_mm -> scaled_gemm always).
# The trace has the output only, so "1-D contiguous bias, beta == 1" is assumed for addmm
# (what nn.Linear calls); dtype and "sizes > 1" are checked on the output.
LT_OPS = frozenset({"aten.addmm", "aten._addmm_activation"})
LT_ALWAYS_OPS = frozenset({"aten._scaled_mm"})
LT_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})

PER_CALL, PERSISTENT, UNIFIED = "per-call", "persistent", "unified"
# Where the cuBLASLt workspace comes from, by the first PyTorch release that does it so.
LT_WORKSPACE_MODES: tuple[tuple[tuple[int, int], str], ...] = (
    # CUDABlas.cpp gemm_and_bias/scaled_gemm: `allocator.allocate(_getWorkspaceSize())`, from 2.6
    # `at::empty(workspaceSize, kByte)` (PR #139442), freed on return; default 1024 KiB
    # ("default size in KiB according to #73328", PR #73439; env from PR #101145).
    ((2, 0), PER_CALL),
    # PR #156495 "cublaslt/hipblaslt persistent workspace" (merged 2025-06-27, after the 2.8
    # branch cut of 2025-06-23, issue #156745): getCUDABlasLtWorkspace() keeps one per
    # (handle, stream) in CublasHandlePool.cpp.
    ((2, 9), PERSISTENT),
    # PR #175879 (merged 2026-03-02, after the 2.11 cut of 2026-02-16..19): the Lt workspace
    # *is* the cuBLAS one unless TORCH_CUBLASLT_UNIFIED_WORKSPACE=0 (PR #168175 had made only
    # the size unified by default, in 2.11).
    ((2, 12), UNIFIED),
)
UNIFIED_OPT_IN = (2, 8)  # TORCH_CUBLASLT_UNIFIED_WORKSPACE=1 exists since PR #151163
LT_SIZE_CAPPED = (2, 11)  # PR #168175: Lt size <= cuBLAS size (getCUDABlasLtWorkspaceSize)
BLACKWELL_32MIB = (2, 12)  # PR #175344 (2026-02-19): 32 MiB default for major 10 and 12 too
SMALL_DEFAULT = 4096 * 1024 * 2 + 16 * 1024 * 8  # ":4096:2:16:8"


def parse_version(text: str | None = None) -> tuple[int, int]:
    """``"2.6"``, ``"2.6.0+cu124"``, ``"2.13.0"`` -> (major, minor); None -> the installed torch."""
    if not text:
        import torch

        text = torch.__version__
    m = re.match(r"\s*v?(\d+)\.(\d+)", text)
    if not m:
        raise ValueError(f"cannot read a PyTorch version from {text!r} (expected e.g. '2.6.0')")
    return int(m[1]), int(m[2])


# The GPU-side PyTorch releases whose library behaviour is modelled (``--torch VERSION``).
TARGET_TORCH: tuple[tuple[int, int], tuple[int, int]] = ((2, 4), (2, 14))


def target_version(text: str) -> tuple[int, int]:
    """``parse_version`` for a version the user names (``--torch``): a release outside
    :data:`TARGET_TORCH` is refused, since its rules would be a guess."""
    v = parse_version(text)
    (lo, hi) = TARGET_TORCH
    if not lo <= v <= hi:
        raise ValueError(f"PyTorch {text.strip()} is outside the releases xmem models on the GPU side "
                         f"({lo[0]}.{lo[1]} to {hi[0]}.{hi[1]})")
    return v


def _env_flag(env, name: str) -> bool | None:
    """c10::utils::check_env: "1"/"true" -> True, "0"/"false" -> False, else unset."""
    value = (env.get(name) or "").strip().lower()
    return {"1": True, "true": True, "0": False, "false": False}.get(value)


def cublas_workspace_bytes(gpu: GPU, environ: dict | None = None, torch_version: str | None = None) -> int:
    """The workspace per cuBLAS handle: ``CUBLAS_WORKSPACE_CONFIG`` when set (``:SIZE_KiB:COUNT``
    pairs, summed as PyTorch's ``parseChosenWorkspaceSize`` does), else the GPU's default."""
    env = os.environ if environ is None else environ
    default = gpu.cublas_workspace_bytes
    if (torch_version and gpu.major in (10, 12) and default == 32 << 20
            and parse_version(torch_version) < BLACKWELL_32MIB):
        default = SMALL_DEFAULT
    text = env.get("CUBLAS_WORKSPACE_CONFIG")
    if not text:
        return default
    pairs = re.findall(r":(\d+):(\d+)", text)
    if not pairs:
        return default  # PyTorch ignores a config it cannot parse too
    return sum(int(size) * 1024 * int(count) for size, count in pairs)


def lt_workspace_mode(torch_version: str | None = None, environ: dict | None = None) -> str:
    """:data:`PER_CALL`, :data:`PERSISTENT` or :data:`UNIFIED` for this PyTorch version."""
    env = os.environ if environ is None else environ
    version = parse_version(torch_version)
    mode = [m for first, m in LT_WORKSPACE_MODES if version >= first][-1]
    unified = _env_flag(env, "TORCH_CUBLASLT_UNIFIED_WORKSPACE")
    if unified and version >= UNIFIED_OPT_IN:
        return UNIFIED
    if unified is False and mode == UNIFIED:
        return PERSISTENT
    return mode


def cublaslt_workspace_bytes(gpu: GPU, environ: dict | None = None, torch_version: str | None = None) -> int:
    """Bytes of one cuBLASLt workspace: ``CUBLASLT_WORKSPACE_SIZE`` KiB (parsed like std::stoi),
    default 1024 KiB; from 2.11 no more than the cuBLAS workspace."""
    env = os.environ if environ is None else environ
    m = re.match(r"\s*\+?(\d+)", env.get("CUBLASLT_WORKSPACE_SIZE") or "")
    size = (int(m[1]) if m else 1024) * 1024
    if parse_version(torch_version) >= LT_SIZE_CAPPED:
        size = min(size, cublas_workspace_bytes(gpu, env, torch_version))
    return size


def op_name(op: str) -> str:
    """``aten.mm.default`` -> ``aten.mm``."""
    parts = op.split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else op


def runs_convolutions(events: Iterable[TraceEvent]) -> bool:
    """Whether a step allocates for a convolution (forward or backward): on a GPU, cuDNN's."""
    return any(e.op.startswith(CONV_OP_PREFIXES) for e in events if e.kind == ALLOC)


def runs_ffts(events: Iterable[TraceEvent]) -> bool:
    """Whether a step allocates for a Fourier transform: on a GPU, cuFFT's."""
    return any(e.op.startswith(FFT_OP_PREFIX) for e in events if e.kind == ALLOC)


def takes_lt_path(e: TraceEvent, environ: dict | None = None) -> bool:
    """Whether the GEMM whose output ``e`` allocates runs on cuBLASLt (see :data:`LT_OPS`)."""
    if e.kind != ALLOC:
        return False
    name = op_name(e.op)
    if name in LT_ALWAYS_OPS:
        return True
    env = os.environ if environ is None else environ
    return (name in LT_OPS and env.get("DISABLE_ADDMM_CUDA_LT") != "1"
            and e.dtype in LT_DTYPES and len(e.shape) == 2 and min(e.shape) > 1)


def adapt_trace(trace: Trace, gpu: GPU, torch_version: str | None = None,
                environ: dict | None = None, gemms: dict[int, list[TraceEvent]] | None = None,
                ) -> tuple[list[TraceEvent], list[str]]:
    """The trace's events as they would be on ``gpu`` under PyTorch ``torch_version`` (default:
    the installed one), plus notes on what was added. ``gemms``: :func:`gemms_into` of the
    trace as traced, where ``trace`` is one with events resized for another GPU."""
    env = os.environ if environ is None else environ
    size = cublas_workspace_bytes(gpu, env, torch_version)
    notes = []
    events = trace.events
    convolutions = trace.meta.get("convolutions")  # recorded by the tracer; a trace file lacks it
    if convolutions is None:
        convolutions = runs_convolutions(events)
    if convolutions:
        calls = trace.meta.get("conv_calls") or []
        table = cudnn.table_for(gpu, env) if calls and not trace.meta.get("cudnn_benchmark") else None
        found = 0
        if table is not None:
            events, found = cudnn.insert_workspaces(events, calls, table)
        notes.append(cudnn.describe(table, found, sum(len(k) for _, k in calls),
                                    bool(trace.meta.get("cudnn_benchmark"))))
    ffts = trace.meta.get("ffts")  # recorded by the tracer; a trace file lacks it
    if ffts if ffts is not None else runs_ffts(trace.events):
        notes.append(CUFFT_NOTE)
    if env.get("CUBLAS_WORKSPACE_CONFIG"):
        notes.append(f"cuBLAS workspace {size} B from CUBLAS_WORKSPACE_CONFIG")
    mode = lt_workspace_mode(torch_version, env)
    lt_size = 0 if mode == UNIFIED else cublaslt_workspace_bytes(gpu, env, torch_version)
    if lt_size:
        notes.append(f"cuBLASLt workspace {lt_size} B {mode} (PyTorch {torch_version or 'installed'})")
    if size == 0 and lt_size == 0:
        return list(events), notes
    return _insert_workspaces(events, size, lt_size, mode, env, gemms_into(trace) if gemms is None else gemms), notes


def gemms_into(trace: Trace) -> dict[int, list[TraceEvent]]:
    """The GEMMs that allocated no output (``mm(..., out=buf)``, as Inductor's compiled code
    calls cuBLAS: ``trace.meta["gemm_into"]``), as output-less stand-ins keyed by the event
    that came before each (its ``id()``; 0: none did): cuBLAS takes its workspaces there all the
    same. Keyed by identity, as other adapters insert events (cuDNN's workspaces)."""
    out: dict[int, list[TraceEvent]] = {}
    events = trace.events
    for n, op, dtype, shape, phase, stream, module, source, iteration in trace.meta.get("gemm_into") or []:
        gemm = TraceEvent(ALLOC, op=op, dtype=dtype, shape=tuple(shape), phase=phase, stream=stream, module=module,
                          source=source, iteration=iteration)
        out.setdefault(id(events[n - 1]) if 0 < n <= len(events) else 0, []).append(gemm)
    return out


def _insert_workspaces(events: list[TraceEvent], size: int, lt_size: int, mode: str,
                       env, into: dict[int, list[TraceEvent]] | None = None) -> list[TraceEvent]:
    """After the first GEMM output of the forward thread and of backward: the cuBLAS workspace.
    After each cuBLASLt GEMM output: an Lt workspace allocated and freed at once (per-call), or
    kept from the first one of its thread (persistent). ``into``: GEMMs without an output of
    their own (:func:`gemms_into`), by the event before them."""
    into = into or {}
    out: list[TraceEvent] = []
    seen: set[tuple[str, int]] = set()
    seen_lt: set[tuple[str, int]] = set()
    next_id = max((e.id for e in events), default=0) + 1

    def alloc(op: str, nbytes: int, e: TraceEvent) -> TraceEvent:
        nonlocal next_id
        next_id += 1
        ws = TraceEvent(ALLOC, id=next_id - 1, bytes=nbytes, stream=e.stream, category="workspace", op=op,
                        module=e.module, phase=e.phase, dtype="uint8", shape=(nbytes,), source=e.source,
                        iteration=e.iteration)
        out.append(ws)
        return ws

    def gemm(e: TraceEvent) -> None:
        key = ("backward" if e.phase == "backward" else "main", e.stream)
        lt = lt_size > 0 and takes_lt_path(e, env)
        per_call = alloc(LT_WORKSPACE_OP, lt_size, e) if lt and mode == PER_CALL else None
        if size and key not in seen:  # getCurrentCUDABlasHandle() -> setWorkspaceForHandle()
            seen.add(key)
            alloc(WORKSPACE_OP, size, e)
        if per_call is not None:  # freed when gemm_and_bias returns
            out.append(replace(per_call, kind=FREE))
        elif lt and mode == PERSISTENT and key not in seen_lt:
            seen_lt.add(key)
            alloc(LT_WORKSPACE_OP, lt_size, e)

    for g in into.get(0, []):  # GEMMs before the trace's first event
        gemm(g)
    for e in events:
        out.append(e)
        if e.kind == ALLOC and op_name(e.op) in GEMM_OPS:
            gemm(e)
        for g in into.get(id(e), ()):
            gemm(g)
    return out


def library_bytes(gpu: GPU, trace: Trace | list[TraceEvent]) -> int:
    """Device memory the run's libraries take outside the caching allocator.

    The catalog's ``kernel_bytes`` when the step put anything on the GPU (its ops load PyTorch's
    and cuBLAS's kernels), plus ``cudnn_bytes`` once a cuDNN op ran and ``nccl_bytes`` once a
    process group of more than one rank exists (``fixed_memory.libraries_used``). A trace that
    puts nothing on the GPU ran no kernel and pays nothing.
    """
    from xmem_engine.gpus.fixed_memory import fixed_memory

    return fixed_memory(gpu, trace).library_bytes
