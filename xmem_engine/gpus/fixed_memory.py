"""The fixed memory of a PyTorch training process: what it holds on the GPU outside its tensors.

A training process pays, before and besides what the caching allocator reserves (nvidia-smi
counts all of it, ``torch.cuda.memory_reserved()`` none of it):

* the CUDA context, with lazy module loading (the catalog's ``context_bytes``);
* the kernels its first ops load: PyTorch's own, cuBLAS / cuBLASLt's at the first matmul
  (``kernel_bytes``), whenever the step put anything on the GPU;
* cuDNN's handle and engine kernels, once a convolution, a recurrent layer, batch norm or cuDNN
  attention ran (``cudnn_bytes``);
* NCCL's communicator, once a process group of more than one rank exists (``nccl_bytes``).

Which of these a step pays comes from its trace (:func:`libraries_used`). Each figure is either
measured on the target GPU or not (its catalog source says ``estimated:`` / ``assumed:``); an
unmeasured one has a [low, high] range (``GPU.part_range``), and :class:`FixedMemory` sums what
the step pays and how far that sum may be off. The estimate's range adds that on top of the
step's calibrated spread (``calibration.peak_range``), so its high end holds on GPUs the
calibration runs never saw.

Two readings of the same peak, because monitors differ (NVML's ``nvmlMemory_t`` / ``_v2_t``):
nvidia-smi's "used" leaves out the memory the driver reserves for itself; NVML v1's ``used``
(total - free, what ``pynvml.nvmlDeviceGetMemoryInfo`` returns by default and many schedulers
and monitors read) counts it. ``torch.cuda.mem_get_info``'s total - free is the first kind: its
total (totalGlobalMem) already leaves the reserve out. The driver's reserve per GPU is the
catalog's ``driver_reserved_bytes``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from xmem_engine.gpus.catalog import GPU
from xmem_engine.trace import ALLOC, Trace, TraceEvent

#: What each part is, as the estimate's notes and the CLI name it.
PART_NAMES = {
    "context_bytes": "CUDA context",
    "kernel_bytes": "kernels (PyTorch, cuBLAS/cuBLASLt)",
    "cudnn_bytes": "cuDNN",
    "nccl_bytes": "NCCL",
    "driver_reserved_bytes": "driver reserve",
}

# aten ops (name prefixes) that run cuDNN on a GPU. Convolutions always (the tracer records them
# as convolutions); batch norm in training (PyTorch's _select_batch_norm_backend picks cuDNN for
# float / half inputs of 3+ dims); cuDNN attention (SDPA's cudnn backend); recurrent layers, which
# the tracer decomposes (cuDNN is refused while tracing), are found by their module types.
CUDNN_OP_PREFIXES = (
    "aten.convolution", "aten._convolution", "aten.cudnn_convolution", "aten.cudnn_batch_norm",
    "aten.native_batch_norm", "aten._native_batch_norm_legit", "aten._batch_norm_impl_index",
    "aten._cudnn_attention", "aten._scaled_dot_product_cudnn_attention", "aten._cudnn_rnn", "aten.lstm",
    "aten.gru", "aten.rnn_tanh", "aten.rnn_relu",
)
RNN_MODULES = frozenset({"LSTM", "GRU", "RNN"})


@dataclass(frozen=True)
class FixedPart:
    """One part of a GPU's fixed memory: its figure, how far it may be off, and why."""

    name: str  # the catalog field: context_bytes, kernel_bytes, cudnn_bytes, nccl_bytes
    what: str  # what it is, in words
    bytes: int
    low_bytes: int
    high_bytes: int
    measured: bool  # measured on this GPU (else estimated or assumed: the range says how far off)
    source: str  # the catalog's source for the figure
    range_source: str = ""  # ... and for its range, where it has one

    def to_json(self) -> dict:
        return asdict(self)


def part(gpu: GPU, name: str) -> FixedPart:
    """Part ``name`` (a catalog field of :data:`PART_NAMES`) of ``gpu``'s fixed memory."""
    value = getattr(gpu, name)
    if value is None:
        raise ValueError(f"GPU '{gpu.key}' has no {name}")
    low, high = gpu.part_range(name)
    return FixedPart(name, PART_NAMES[name], value, low, high, gpu.measured(name), gpu.sources.get(name, ""),
                     gpu.sources.get(f"{name}_range", "") if (low, high) != (value, value) else "")


def parts(gpu: GPU) -> list[FixedPart]:
    """Every part of ``gpu``'s fixed memory, whether a step pays it or not (``xmem gpus``, tests)."""
    return [part(gpu, n) for n in ("context_bytes", "kernel_bytes", "cudnn_bytes", "nccl_bytes")]


def libraries_used(trace: Trace | list[TraceEvent]) -> frozenset[str]:
    """What the traced step initialises on a GPU: ``"kernels"`` when it put anything there (its
    ops load PyTorch's and, at the first matmul, cuBLAS's kernels), ``"cudnn"`` when a cuDNN op
    ran, ``"nccl"`` when it made a process group of more than one rank."""
    events = trace.events if isinstance(trace, Trace) else trace
    meta = trace.meta if isinstance(trace, Trace) else {}
    allocs = [e for e in events if e.kind == ALLOC]
    used = set()
    if allocs:
        used.add("kernels")
    types = set((meta.get("module_types") or {}).values())
    if meta.get("convolutions") or types & RNN_MODULES or any(e.op.startswith(CUDNN_OP_PREFIXES) for e in allocs):
        used.add("cudnn")
    if made_process_group(meta):
        used.add("nccl")
    return frozenset(used)


def made_process_group(meta: dict) -> bool:
    """Whether the traced code made a process group of more than one rank (the tracer notes
    NCCL's buffers when it made one; the world says how many ranks)."""
    from xmem_engine.tracing.distributed import NCCL_NOTE

    world = meta.get("world") or {}
    return NCCL_NOTE in (meta.get("notes") or ()) and int(world.get("size", 1)) > 1


LIBRARY_PARTS = {"kernels": "kernel_bytes", "cudnn": "cudnn_bytes", "nccl": "nccl_bytes"}


@dataclass(frozen=True)
class FixedMemory:
    """The fixed memory one step pays on one GPU: its parts, their sum, and how far off it may be."""

    gpu: str  # catalog key
    parts: tuple[FixedPart, ...]  # the parts this step pays: the context first, then its libraries
    driver_reserved: FixedPart | None = None  # the driver's reserve (NVML v1's total - free counts it)

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.parts)

    @property
    def library_bytes(self) -> int:
        """The parts outside the context: libraries' memory outside the caching allocator."""
        return sum(p.bytes for p in self.parts if p.name != "context_bytes")

    @property
    def below_bytes(self) -> int:
        """How much less the parts may take than their figures (unmeasured parts only)."""
        return sum(p.bytes - p.low_bytes for p in self.parts)

    @property
    def above_bytes(self) -> int:
        """How much more the parts may take than their figures (unmeasured parts only)."""
        return sum(p.high_bytes - p.bytes for p in self.parts)

    @property
    def unmeasured(self) -> tuple[FixedPart, ...]:
        """The parts with a range: not measured on this GPU."""
        return tuple(p for p in self.parts if (p.low_bytes, p.high_bytes) != (p.bytes, p.bytes))

    def describe(self) -> str:
        """One line: the parts, and which were not measured on this GPU."""
        mib = 1 << 20
        body = " + ".join(f"{p.what} {p.bytes / mib:,.0f}" for p in self.parts)
        line = f"fixed memory (MiB): {body} = {self.bytes / mib:,.0f}"
        if self.unmeasured:
            names = ", ".join(p.what for p in self.unmeasured)
            line += (f"; not measured on this GPU: {names} (the range allows -{self.below_bytes / mib:,.0f} / "
                     f"+{self.above_bytes / mib:,.0f} MiB for them)")
        else:
            line += "; measured on this GPU"
        return line

    def to_json(self) -> dict:
        return {"bytes": self.bytes, "low_bytes": self.bytes - self.below_bytes,
                "high_bytes": self.bytes + self.above_bytes, "parts": [p.to_json() for p in self.parts],
                "driver_reserved": self.driver_reserved.to_json() if self.driver_reserved else None}


def fixed_memory(gpu: GPU, trace: Trace | list[TraceEvent]) -> FixedMemory:
    """The fixed memory ``trace``'s step pays on ``gpu`` (see :func:`libraries_used`)."""
    used = libraries_used(trace)
    paid = [part(gpu, "context_bytes")] + [part(gpu, LIBRARY_PARTS[lib]) for lib in ("kernels", "cudnn", "nccl")
                                          if lib in used]
    reserve = part(gpu, "driver_reserved_bytes") if gpu.driver_reserved_bytes is not None else None
    return FixedMemory(gpu.key, tuple(paid), reserve)
