"""Buffers that CUDA kernels allocate for themselves through the caching allocator, where the
CPU kernel the tracer runs allocates nothing.

Why: a few CUDA kernels make tensors of their own while they run, allocated and freed inside
one op. They never reach the dispatch modes (they are made in C++ below them), so the tracer
re-creates them from the op's arguments, with the sizes the CUDA source gives. Each rule
returns a short program of steps, ``("alloc", slot, nbytes)`` or ``("free", slot, 0)``, in
the order the kernel runs them; the tracer replays it right after the op's own outputs are
allocated (:meth:`Tracer.transients`).

Rules (PyTorch's ``aten/src/ATen/native``; the recordings in ``benchmarks/recordings.py``
show them on real GPUs):

* ``_index_put_impl_`` with ``accumulate=True`` (autograd's backward of ``x[idx]`` and of an
  embedding written as indexing, ``index_put_(..., accumulate=True)``) runs
  ``index_put_with_sort_kernel`` (``cuda/Indexing.cu``): ``makeLinearIndex`` /
  ``computeLinearIndex`` (``TensorAdvancedIndexing``/``IndexingUtils``) make each index
  tensor's ``remainder`` (``wrapIndexOnce``) and its product with the stride (the linear
  index; the remainder is freed at once), then the kernel makes ``sorted_indices`` and
  ``orig_indices`` (``empty_like`` of the linear index) and ``range`` (``arange``), all int64
  of the index count, and frees them in reverse order when it returns. CUB's own temporary
  storage for the radix sort is not re-created: its size is CUB's choice (1 B for 512 keys
  on the recorded runs), not given by PyTorch's source.
* ``_softmax`` / ``_log_softmax`` of a non-contiguous input copy it contiguous for the kernel
  (:func:`contiguous_input`).
* cuFFT's transforms (``cuda/SpectralOps.cpp``): a complex-to-real one copies its input (cuFFT
  may overwrite it), a real-to-complex one over dims cuFFT's one-plan path does not take uses a
  second output-sized buffer. cuFFT's own plan workspace (its size is cuFFT's, asked for when
  the plan is made on the GPU) is not re-created: the estimate says so.
* Reductions over dimensions (``sum``, ``mean``, ``amax``, ``max(dim)``, ``norm``, ``var``...)
  run ``gpu_reduce_kernel``, which allocates a staging buffer and its semaphores when it
  splits each output's inputs across thread blocks: sizes from the launch configuration,
  ported in ``cuda_reduce.py`` from ``cuda/Reduce.cuh`` and ``TensorIterator.cpp``; they depend
  on the GPU's SM count and threads per SM, so the rule reads the target GPU's.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from xmem_engine.tracing.kernels.cuda_reduce import kernel_params, reduce_plan
from xmem_engine.tracing.ops import register
from xmem_engine.tracing.symbolic import hint

Step = tuple  # ("alloc", slot, nbytes[, shape, dtype of what it copies]) or ("free", slot, 0)


@dataclass(frozen=True)
class Device:
    """What the rules need of the target GPU and the PyTorch that runs on it."""

    sm_count: int
    max_threads_per_sm: int
    torch_version: str


# cudaDeviceProp::maxThreadsPerMultiProcessor by compute capability (CUDA C++ Programming
# Guide, "Compute Capabilities", "Maximum number of resident threads per SM").
_THREADS_PER_SM = {(7, 5): 1024, (8, 6): 1536, (8, 7): 1536, (8, 9): 1536, (12, 0): 1536, (12, 1): 1536}


@dataclass(frozen=True)
class BySM:
    """Steps that depend on the GPU's SM count and threads per SM (a reduction's staging
    buffers): the arguments of :func:`cuda_reduce.reduce_plan` other than the device's, so an
    estimate for another GPU can size them again (``gpus/cuda_libraries.adapt_trace``)."""

    plan_args: tuple  # shape, strides, reduce dims, input / accumulator / output item sizes, vt0, ivs, offset

    def steps(self, device: Device) -> list[Step]:
        """The steps at the traced size (``plan_args`` stay symbolic in the trace: symbolic.py)."""
        return plan_steps(hint(self.plan_args), device.sm_count, device.max_threads_per_sm, device.torch_version)


@functools.lru_cache(maxsize=4096)
def _plan_steps(plan_args: tuple, sm_count: int, max_threads_per_sm: int, torch_version: str) -> tuple[Step, ...]:
    shape, strides, dims, isize, acc, osize, vt0, ivs, offset = plan_args
    return tuple(reduce_plan(tuple(shape), tuple(strides), list(dims), isize, acc,
                             tuple(osize) if isinstance(osize, (list, tuple)) else osize,
                             sm_count, max_threads_per_sm, vt0, ivs, torch_version, offset).steps())


def plan_steps(plan_args: Any, sm_count: int, max_threads_per_sm: int, torch_version: str) -> list[Step]:
    """A reduction's steps on a GPU with this SM count (``plan_args`` as :class:`BySM` holds
    them, or as a trace's JSON gives them back: lists)."""
    hashable = tuple(tuple(a) if isinstance(a, list) else a for a in plan_args)
    return list(_plan_steps(hashable, int(sm_count), int(max_threads_per_sm), torch_version))


def threads_per_sm(major: int, minor: int) -> int:
    """``cudaDeviceProp::maxThreadsPerMultiProcessor`` for a compute capability."""
    return _THREADS_PER_SM.get((int(major), int(minor)), 2048)


def device_of(props: Any) -> Device:
    cc = (int(props.major), int(props.minor))
    return Device(int(props.multi_processor_count), threads_per_sm(*cc), torch.__version__)


def _broadcast_numel(tensors: list[torch.Tensor]) -> int:
    if all(t.shape == tensors[0].shape for t in tensors[1:]):  # (a symbolic batch's sizes kept as they are)
        return tensors[0].numel()
    return torch.broadcast_shapes(*(t.shape for t in tensors)).numel()


def index_put_with_sort(args: tuple, kwargs: dict, device: Device) -> list[Step] | None:
    names = ("self", "indices", "values", "accumulate", "unsafe")
    a = dict(zip(names, args), **kwargs)
    if not (a.get("accumulate") or torch.are_deterministic_algorithms_enabled()):
        return None  # index_put_kernel: no buffers of its own
    indices = [i for i in a["indices"] if i is not None]
    values = a["values"]
    if not indices or any(i.dtype in (torch.bool, torch.uint8) for i in indices):
        return None  # boolean masks go through nonzero first: not modelled here
    if any(i.dtype != torch.long for i in indices):
        return None  # int32 indices are converted first: not modelled here
    n = _broadcast_numel(indices)
    if n == 0 or values.numel() == 0:
        return None
    nbytes = n * 8
    steps: list[Step] = []
    for k in range(len(indices)):  # computeLinearIndex
        steps += [("alloc", f"remainder{k}", nbytes), ("alloc", f"index{k}", nbytes), ("free", f"remainder{k}", 0)]
        if k:  # linearIndex += index: the index goes
            steps.append(("free", f"index{k}", 0))
    steps += [("alloc", "sorted_indices", nbytes), ("alloc", "orig_indices", nbytes), ("alloc", "range", nbytes),
              ("free", "range", 0), ("free", "orig_indices", 0), ("free", "sorted_indices", 0), ("free", "index0", 0)]
    return steps


def coalesce_scratch(args: tuple, kwargs: dict, device: Device) -> list[Step] | None:
    """``_coalesce_sparse_cuda`` (``sparse/cuda/SparseCUDATensor.cu``): ``origIndices`` and
    ``uniqueOffsets``, int64, one per entry, freed when it returns (Thrust's sort buffers are
    not re-created, as CUB's are not above)."""
    x = args[0]
    nnz = x._nnz() if x.layout is torch.sparse_coo else 0
    if nnz < 2:
        return None  # a clone
    return [("alloc", "orig_indices", 8 * nnz), ("alloc", "unique_offsets", 8 * nnz),
            ("free", "unique_offsets", 0), ("free", "orig_indices", 0)]


def _dims(dim: Any, ndim: int) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(ndim))
    if isinstance(dim, int):
        return [dim]
    return list(dim)


def reduction(kind: str, dim_at: int | None, outputs: int = 1) -> Callable[[tuple, dict, Device], BySM | None]:
    """The rule of a reduction op: ``kind`` as in :func:`cuda_reduce.kernel_params`, the
    position of its ``dim`` argument (None: it reduces everything), its number of outputs."""

    def rule(args: tuple, kwargs: dict, device: Device) -> list[Step] | None:
        x = args[0]
        if not isinstance(x, torch.Tensor) or x.numel() == 0 or x.is_complex():
            return None
        dim = None
        if dim_at is not None:
            dim = args[dim_at] if len(args) > dim_at else kwargs.get("dim")
        out_dtype = kwargs.get("dtype") or x.dtype
        if kind in ("sum", "mean") and not out_dtype.is_floating_point:
            out_dtype = torch.long if not x.dtype.is_floating_point else out_dtype
        vt0, ivs, acc = kernel_params(kind, x.dtype, device.torch_version)
        out_size = torch.empty((), dtype=out_dtype).element_size() if kind not in ("any", "all") else 1
        sizes = (out_size, 8) if outputs == 2 else out_size
        return BySM((tuple(x.shape), tuple(x.stride()), tuple(_dims(dim, x.dim())), x.element_size(), acc, sizes,
                     vt0, ivs, x.storage_offset()))

    return rule


def contiguous_input(args: tuple, kwargs: dict, device: Device) -> list[Step] | None:
    """``host_softmax`` (``cuda/SoftMax.cu``) runs on ``input_.contiguous()``, after the structured
    op allocated its (contiguous) output: a strided input, such as the logits of a matmul whose
    output Inductor padded (row stride 50,264 for GPT-2's 50,257 words), is copied for the kernel
    and freed when it returns. The compiled GPT-2 recorded on an H200 shows the copy, 823,410,688 B
    at the loss, every step (benchmarks/data/gpu_groundtruth-nvidia-h200-2026-12-04.jsonl)."""
    x = args[0] if args else None
    if not isinstance(x, torch.Tensor) or x.is_contiguous():
        return None
    like = (tuple(x.shape), str(x.dtype).removeprefix("torch."))  # the copy's, as the event shows it
    return [("alloc", "input", x.numel() * x.element_size(), *like), ("free", "input", 0)]


def _optimized_cufft_path(dim: Any) -> bool:
    """``use_optimized_cufft_path`` (``cuda/SpectralOps.cpp``): one cuFFT plan for at most 3
    dims, unless they start with (0, 1)."""
    dim = list(dim)
    return len(dim) <= 3 and not (len(dim) >= 2 and dim[0] == 0 and dim[1] == 1)


def fft_c2r_input_copy(args: tuple, kwargs: dict, device: Device) -> list[Step] | None:
    """``_fft_c2r_cufft`` (``irfft``, ``irfft2``, ``irfftn``): a complex-to-real transform may
    overwrite its input, so the input is always copied contiguous ("must always clone",
    gh-34551) after the output is made, and freed when it returns; where the optimised path is
    not taken, the C2C transforms' result, of the same size, takes the copy's place."""
    x = args[0]
    like = (tuple(x.shape), str(x.dtype).removeprefix("torch."))
    return [("alloc", "input", x.numel() * x.element_size(), *like), ("free", "input", 0)]


def fft_r2c_second_buffer(args: tuple, kwargs: dict, device: Device) -> list[Step] | None:
    """``_fft_r2c_cufft`` over several dims off the optimised path: the last dim's R2C and then
    the C2C transforms go back and forth between the output and a second buffer of its size."""
    names = ("self", "dim", "normalization", "onesided")
    a = dict(zip(names, args), **kwargs)
    dim = list(a["dim"])
    if len(dim) < 2 or _optimized_cufft_path(dim):
        return None
    x = a["self"]
    sizes = list(x.shape)
    if a.get("onesided", True):
        sizes[dim[-1]] = sizes[dim[-1]] // 2 + 1
    nbytes = 2 * x.element_size() * math.prod(sizes)  # complex
    return [("alloc", "buffer", nbytes), ("free", "buffer", 0)]


_aten = torch.ops.aten
RULES: dict[Any, Callable[[tuple, dict, Device], list[Step] | BySM | None]] = {
    _aten._log_softmax.default: contiguous_input,
    _aten._softmax.default: contiguous_input,
    _aten._index_put_impl_.default: index_put_with_sort,
    _aten.index_put_.default: index_put_with_sort,
    _aten.index_put.default: index_put_with_sort,
    _aten._coalesce.default: coalesce_scratch,
    _aten._fft_c2r.default: fft_c2r_input_copy,
    _aten._fft_r2c.default: fft_r2c_second_buffer,
    _aten.sum.dim_IntList: reduction("sum", 1),
    _aten.sum.default: reduction("sum", None),
    _aten.mean.dim: reduction("mean", 1),
    _aten.mean.default: reduction("mean", None),
    _aten.amax.default: reduction("amax", 1),
    _aten.amin.default: reduction("amin", 1),
    _aten.max.dim: reduction("max_dim", 1, outputs=2),
    _aten.min.dim: reduction("min_dim", 1, outputs=2),
    _aten.max.default: reduction("max", None),
    _aten.min.default: reduction("min", None),
    _aten.argmax.default: reduction("argmax", 1),
    _aten.argmin.default: reduction("argmin", 1),
    _aten.linalg_vector_norm.default: reduction("norm", 2),
    _aten.var.correction: reduction("var", 1),
    _aten.std.correction: reduction("std", 1),
    _aten.var_mean.correction: reduction("var_mean", 1, outputs=2),
    _aten.std_mean.correction: reduction("std_mean", 1, outputs=2),
    _aten.prod.dim_int: reduction("prod", 1),
    _aten.any.dim: reduction("any", 1),
    _aten.all.dim: reduction("all", 1),
    _aten.any.dims: reduction("any", 1),
    _aten.all.dims: reduction("all", 1),
    _aten.any.default: reduction("any", None),
    _aten.all.default: reduction("all", None),
}
register("cuda temporaries", RULES, __name__)


def resized_by_sm(trace: Any, sm_count: int, major: int, minor: int) -> list | None:
    """The trace's events with its SM-dependent transients (``Trace.meta["by_sm"]``, written
    by ``Tracer.transients``) sized for a GPU with ``sm_count`` SMs of compute capability
    ``major.minor``; None when they are the traced GPU's already (or the trace has none)."""
    from xmem_engine.trace import ALLOC, FREE, Category, TraceEvent

    by = trace.meta.get("by_sm")
    threads = threads_per_sm(major, minor)
    if not by or (int(sm_count), threads) == (by["sm_count"], by["max_threads_per_sm"]):
        return None
    events = trace.events
    out: list = []
    next_id = max((e.id for e in events), default=0) + 1
    prev = 0
    for at, n, plan_args, stream, op, module, phase, source, iteration in by["groups"]:
        out.extend(events[prev:at])
        prev = at + n
        slots: dict[str, Any] = {}
        for action, slot, nbytes in plan_steps(plan_args, sm_count, threads, by["torch_version"]):
            if action == "alloc":
                slots[slot] = TraceEvent(ALLOC, id=next_id, bytes=nbytes, stream=stream, category=Category.TEMPORARY,
                                         op=op, module=module, phase=phase, dtype="uint8", shape=(nbytes,),
                                         source=source, iteration=iteration)
                next_id += 1
                out.append(slots[slot])
            else:
                a = slots.pop(slot)
                out.append(TraceEvent(FREE, id=a.id, bytes=a.bytes, stream=stream, category=a.category, op=op,
                                      module=module, phase=phase, dtype="uint8", shape=a.shape, iteration=iteration))
    out.extend(events[prev:])
    return out
