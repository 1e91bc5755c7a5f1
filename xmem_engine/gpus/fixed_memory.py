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


def libraries_used(trace: Trace | list[TraceEvent], process_group: bool | None = None) -> frozenset[str]:
    """What the traced step initialises on a GPU: ``"kernels"`` when it put anything there (its
    ops load PyTorch's and, at the first matmul, cuBLAS's kernels), ``"cudnn"`` when a cuDNN op
    ran, ``"nccl"`` when it made a process group (``process_group``: the estimate reads the
    tracer's note; None: taken as made) in a world of more than one rank."""
    events = trace.events if isinstance(trace, Trace) else trace
    meta = trace.meta if isinstance(trace, Trace) else {}
    allocs = [e for e in events if e.kind == ALLOC]
    used = set()
    if allocs:
        used.add("kernels")
    types = set((meta.get("module_types") or {}).values())
    if meta.get("convolutions") or types & RNN_MODULES or any(e.op.startswith(CUDNN_OP_PREFIXES) for e in allocs):
        used.add("cudnn")
    if int((meta.get("world") or {}).get("size", 1)) > 1 and process_group is not False:
        used.add("nccl")
    return frozenset(used)


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

    def nccl_note(self) -> str | None:
        """The estimate's note on NCCL's memory, when the step pays it."""
        nccl = next((p for p in self.parts if p.name == "nccl_bytes"), None)
        if nccl is None:
            return None
        return (f"NCCL's communicator, outside PyTorch's allocator, is included as fixed memory: "
                f"{nccl.bytes >> 20:,} MiB (range {nccl.low_bytes >> 20:,}-{nccl.high_bytes >> 20:,} MiB; it grows "
                f"with channels, peers and algorithm, and an all-to-all connects many more; the traced code's "
                f"backend is taken to be NCCL)")

    def to_json(self) -> dict:
        return {"bytes": self.bytes, "low_bytes": self.bytes - self.below_bytes,
                "high_bytes": self.bytes + self.above_bytes, "parts": [p.to_json() for p in self.parts],
                "driver_reserved": self.driver_reserved.to_json() if self.driver_reserved else None}


def fixed_memory(gpu: GPU, trace: Trace | list[TraceEvent], process_group: bool | None = None) -> FixedMemory:
    """The fixed memory ``trace``'s step pays on ``gpu`` (see :func:`libraries_used`)."""
    used = libraries_used(trace, process_group)
    paid = [part(gpu, "context_bytes")] + [part(gpu, LIBRARY_PARTS[lib]) for lib in ("kernels", "cudnn", "nccl")
                                          if lib in used]
    reserve = part(gpu, "driver_reserved_bytes") if gpu.driver_reserved_bytes is not None else None
    return FixedMemory(gpu.key, tuple(paid), reserve)


@dataclass(frozen=True)
class Readings:
    """Two readings of one peak, so that a scheduler compares like with like.

    ``nvidia_smi_bytes``: nvidia-smi's used (``torch.cuda.mem_get_info``'s total - free reads the
    same: its total, totalGlobalMem, already leaves the driver's reserve out). ``total_minus_free_bytes``:
    NVML v1's used, total - free as ``pynvml.nvmlDeviceGetMemoryInfo`` and many schedulers and
    monitors read it, which also counts the driver's reserve (NVML v2's "Reserved"). Each with its
    range: the estimate's, and for total - free also the reserve's own (it varies by driver).
    """

    nvidia_smi_bytes: int
    low_bytes: int | None  # the nvidia-smi reading's range (None without a calibrated range)
    high_bytes: int | None
    driver_reserved: FixedPart | None  # None: not known for this GPU

    @classmethod
    def of(cls, peak_bytes: int, peak_range, fixed: FixedMemory | None) -> "Readings":
        """From an estimate's peak, its range (``calibration.PeakRange`` or None) and fixed memory."""
        return cls(peak_bytes, peak_range.low_bytes if peak_range else None,
                   peak_range.high_bytes if peak_range else None, fixed.driver_reserved if fixed else None)

    @property
    def driver_reserved_bytes(self) -> int | None:
        return self.driver_reserved.bytes if self.driver_reserved else None

    @property
    def total_minus_free_bytes(self) -> int | None:
        r = self.driver_reserved
        return None if r is None else self.nvidia_smi_bytes + r.bytes

    @property
    def total_minus_free_range(self) -> tuple[int, int] | None:
        r = self.driver_reserved
        if r is None or self.low_bytes is None or self.high_bytes is None:
            return None
        return self.low_bytes + r.low_bytes, self.high_bytes + r.high_bytes

    def describe(self) -> str:
        gib = 1 << 30
        line = f"readings: nvidia-smi used {self.nvidia_smi_bytes / gib:.2f} GiB"
        both, r = self.total_minus_free_bytes, self.driver_reserved
        if both is None or r is None:
            return line + "; total - free (NVML v1 used): unknown, no driver reserve known for this GPU"
        line += (f"; total - free (NVML v1 used, pynvml's default) {both / gib:.2f} GiB, with the driver's reserve "
                 f"of {r.bytes / gib:.2f} GiB")
        rng = self.total_minus_free_range
        return line + (f" (range {rng[0] / gib:.2f}-{rng[1] / gib:.2f} GiB)" if rng else "")

    def to_json(self) -> dict:
        """The JSON and report fields: ``driver_reserved_bytes``, ``peak_total_minus_free_bytes``
        with ``_low`` / ``_high``, and ``readings`` (both in words)."""
        rng = self.total_minus_free_range
        return {"driver_reserved_bytes": self.driver_reserved_bytes,
                "peak_total_minus_free_bytes": self.total_minus_free_bytes,
                "peak_total_minus_free_bytes_low": rng[0] if rng else None,
                "peak_total_minus_free_bytes_high": rng[1] if rng else None,
                "readings": self.describe()}
