"""The scratch buffers of PyTorch's CUDA reduction kernels, computed on the CPU.

Why: on a CUDA GPU, ``sum``/``mean``/``max``/``amax``/``norm``/``var``/... over dimensions run
``gpu_reduce_kernel`` (``aten/src/ATen/native/cuda/Reduce.cuh``). When its launch
configuration splits each output's inputs across several thread blocks
(``ReduceConfig::should_global_reduce()``), it allocates, through the caching allocator, a
staging ``buffer`` of ``config.global_memory_size()`` bytes and then a ``semaphores`` buffer
of ``config.semaphore_size()`` bytes; both are ``at::DataPtr`` locals of ``gpu_reduce_kernel``,
so they are freed when it returns, in reverse declaration order: the semaphores first, then
the buffer. The CPU kernels allocate nothing, so a tracer running on the CPU has to re-create
them. This module is a pure-Python port of the host-side code that decides those sizes; it
needs no torch.

What is ported (the CUDA path; the ``#ifdef USE_ROCM`` branches are left out), read at the
tags v2.6.0, v2.7.0, v2.8.0, v2.9.0, v2.10.0, v2.11.0, v2.12.0 and v2.14.1 (the
``Reduce.cuh`` shipped in each release's wheel; v2.13.0's is identical to v2.12.0's on the
CUDA path):

* ``aten/src/ATen/native/cuda/Reduce.cuh``: ``struct ReduceConfig`` (``set_block_dimension``,
  ``split_input``, ``split_output``, ``grid``, ``should_global_reduce``,
  ``global_memory_size``, ``semaphore_size``, ``values_per_thread``), ``last_pow2``,
  ``div_up``, ``mnt_wrapper`` (``MAX_NUM_THREADS``), ``get_output_vec_size``,
  ``setReduceConfig``, ``gpu_reduce_kernel`` (the ``with_32bit_indexing`` split, the
  ``AccumulationBuffer`` for split launches, the buffer/semaphore allocation order).
* ``aten/src/ATen/TensorIterator.cpp`` (TensorIterator as built by ``TensorIterator::reduce_op``
  for ``make_reduction``): ``compute_strides``, ``reorder_dimensions``,
  ``coalesce_dimensions``, ``num_output_elements``, ``num_reduce_dims``,
  ``can_use_32bit_indexing``, ``get_dim_to_split``, ``split``, ``narrow`` and
  ``SplitUntil32Bit::iterator::operator++`` (the order of the sub-launches); read from a
  2023-or-later copy of main (commit 004f63d3), these functions being the same in the
  2.x releases as far as the recordings show.
* ``aten/src/ATen/native/ReduceOpsUtils.h``: ``review_reduce_result`` (the output is viewed
  with stride 0 in the reduced dims) and ``resize_reduction`` (the output is contiguous).

Version differences on the CUDA path (``setReduceConfig``, "vectorize along input"):

* v2.6: ``dim0 > 128 && num_reduce_dims == 1 && vt0 >= ReduceConfig::input_vec_size``, with
  ``input_vec_size`` fixed at 4 (no template parameter).
* v2.7 to v2.9: ``input_vec_size`` becomes a template parameter (default ``vt0``); the test is
  ``dim0 > 128 && num_reduce_dims == 1 && vt0 >= input_vec_size``.
* v2.10 on: ``dim0 >= 128 && num_reduce_dims == 1``.

(These change the block shape, but, as far as can be seen, never whether or how much a
launch allocates: vectorizing along the input only matters when the reduced extent is short,
and then each thread has too few values to split the reduction across blocks.)

Kernel template arguments by op (read from the ``gpu_reduce_kernel<...>`` symbols of each
release's ``libtorch_cuda.so``; :func:`kernel_params`): ``vt0 = 4`` and
``input_vec_size = vt0`` everywhere, except Welford (var/std) with ``vt0 = 2``, and, from
v2.10 on, sum and mean of 2-byte inputs (float16, bfloat16) with ``input_vec_size = 8``.

The element size of the staging buffer is ``sizeof(arg_t)``, the reduction's accumulator:
float for sum/mean/norm of float16/bfloat16/float32, ``pair<scalar_t, int64_t>`` (16 B) for
``max``/``min`` with a dim, ``WelfordData<acc, int>`` (16 B for float) for var/std, the input
type itself for ``amax``/``amin``.

Checked against real GPU recordings (tests/tracing/test_cuda_reduce.py): on an H100 with torch 2.6,
an RMSNorm gradient summed over a last dim that is not the fastest-moving one, and a
vocabulary-wide ``max(dim=-1)`` and ``sum`` of logits stored vocabulary-major; a full
``sum()`` to a scalar (a v2.6-era build); RMSNorm weight gradients (``sum`` over the batch
dims) on a non-Hopper GPU with torch 2.11, including the context length where no buffer
appears. (The ``compute_NN`` in those frames' file names is the last architecture the wheel
was built for, not the GPU's: v2.6 H100 and non-Hopper runs both show ``compute_90``.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "ReduceBuffers",
    "ReduceConfig",
    "ReducePlan",
    "kernel_params",
    "reduce_buffers",
    "reduce_config",
    "reduce_plan",
]

WARP_SIZE = 32  # at::cuda::warp_size() on CUDA (C10_WARP_SIZE)
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class ReduceBuffers:
    """The scratch memory of one ``gpu_reduce_kernel`` launch, in bytes as requested from the
    caching allocator (``buffer`` first, then ``semaphores``; both 0 when the launch reduces
    within thread blocks only)."""

    buffer_bytes: int  # config.global_memory_size(); 0 when no global reduce
    semaphore_bytes: int  # config.semaphore_size(); 0 when no global reduce


# --------------------------------------------------------------------------- version
def _version(torch_version: str | tuple[int, ...] | None) -> tuple[int, int]:
    """(major, minor) of a version such as "2.11.0+cu130"; None means the newest rules."""
    if torch_version is None:
        return (99, 0)
    if isinstance(torch_version, tuple):
        return (int(torch_version[0]), int(torch_version[1]) if len(torch_version) > 1 else 0)
    parts = str(torch_version).split("+")[0].split(".")
    digits = []
    for p in parts[:2]:
        num = ""
        for ch in p:
            if not ch.isdigit():
                break
            num += ch
        digits.append(int(num or 0))
    while len(digits) < 2:
        digits.append(0)
    return (digits[0], digits[1])


# --------------------------------------------------------------------------- Reduce.cuh helpers
def _div_up(a: int, b: int) -> int:
    """``div_up`` (Reduce.cuh): ceiling division of non-negative integers."""
    return (a + b - 1) // b


def _last_pow2(n: int) -> int:
    """``last_pow2`` (Reduce.cuh): the largest power of two <= n, at least 1."""
    n &= 0xFFFFFFFF
    n |= n >> 1
    n |= n >> 2
    n |= n >> 4
    n |= n >> 8
    n |= n >> 16
    return max(1, n - (n >> 1))


@dataclass
class ReduceConfig:
    """Port of ``struct ReduceConfig`` (Reduce.cuh), the fields ``setReduceConfig`` sets."""

    element_size_bytes: int
    num_inputs: int
    num_outputs: int
    step_input: int = 1
    step_output: int = 1
    ctas_per_output: int = 1
    input_mult: list[int] = field(default_factory=lambda: [0, 0, 0])
    output_mult: list[int] = field(default_factory=lambda: [0, 0])
    block_width: int = 0
    block_height: int = 0
    num_threads: int = 0
    vectorize_input: bool = False
    output_vec_size: int = 1

    def set_block_dimension(self, dim0: int, dim1: int, max_threads: int) -> None:
        """``ReduceConfig::set_block_dimension<T>``; ``max_threads`` is
        ``mnt_wrapper<T>::MAX_NUM_THREADS``."""
        max_num_threads = max_threads // self.output_vec_size
        dim0_pow2 = _last_pow2(dim0) if dim0 < max_num_threads else max_num_threads
        dim1_pow2 = _last_pow2(dim1) if dim1 < max_num_threads else max_num_threads
        self.block_width = min(dim0_pow2, WARP_SIZE)
        self.block_height = min(dim1_pow2, max_num_threads // self.block_width)
        self.block_width = min(dim0_pow2, max_num_threads // self.block_height)
        self.num_threads = self.block_width * self.block_height

    def split_input(self, parallelism: int) -> int:
        step = self.step_input
        self.step_input *= parallelism
        return step

    def split_output(self, parallelism: int) -> int:
        step = self.step_output
        self.step_output *= parallelism
        return step

    def block(self) -> tuple[int, int]:
        return (self.block_width, self.block_height)

    def grid(self) -> tuple[int, int]:
        return (_div_up(self.num_outputs // self.output_vec_size, self.step_output), self.ctas_per_output)

    def should_block_x_reduce(self) -> bool:
        return self.input_mult[0] != 0

    def should_block_y_reduce(self) -> bool:
        return self.input_mult[1] != 0

    def should_global_reduce(self) -> bool:
        return self.input_mult[2] != 0

    def global_memory_size(self) -> int:
        if not self.should_global_reduce():
            return 0
        size = self.element_size_bytes * self.num_outputs * self.ctas_per_output
        if not self.should_block_x_reduce():
            size *= self.block_width * self.output_vec_size
        return size

    def semaphore_size(self) -> int:
        if not self.should_global_reduce():
            return 0
        return 4 * self.grid()[0]  # sizeof(int) * grid().x

    def values_per_thread(self) -> int:
        return _div_up(self.num_inputs, self.step_input)

    def buffers(self) -> ReduceBuffers:
        return ReduceBuffers(self.global_memory_size(), self.semaphore_size())


# --------------------------------------------------------------------------- TensorIterator
class _ReductionIter:
    """The parts of a reduction ``TensorIterator`` (TensorIterator.cpp) that
    ``setReduceConfig`` reads: shape and per-operand byte strides after ``reorder_dimensions``
    and ``coalesce_dimensions``; operands are the outputs, then the input (last)."""

    def __init__(self, shape: list[int], strides: list[list[int]], noutputs: int, offsets: list[int]):
        self.shape = shape
        self.strides = strides  # strides[arg][dim], bytes
        self.noutputs = noutputs
        self.offsets = offsets  # byte offset of each operand's data pointer from its (aligned) base

    def copy(self) -> _ReductionIter:
        return _ReductionIter(list(self.shape), [list(s) for s in self.strides], self.noutputs, list(self.offsets))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def ntensors(self) -> int:
        return len(self.strides)

    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def num_output_elements(self) -> int:
        """``TensorIteratorBase::num_output_elements``."""
        elem = 1
        for d in range(self.ndim):
            if self.strides[0][d] != 0 or self.shape[d] == 0:
                elem *= self.shape[d]
        return elem

    def num_reduce_dims(self) -> int:
        """``TensorIteratorBase::num_reduce_dims``."""
        return sum(1 for d in range(self.ndim) if self.strides[0][d] == 0)

    def can_use_32bit_indexing(self) -> bool:
        """``TensorIteratorBase::can_use_32bit_indexing``."""
        if self.numel() > INT32_MAX:
            return False
        for st in self.strides:
            max_offset = 1
            for d in range(self.ndim):
                max_offset += (self.shape[d] - 1) * st[d]
            if max_offset > INT32_MAX:
                return False
        return True

    def get_dim_to_split(self) -> int:
        """``TensorIteratorBase::get_dim_to_split``."""
        max_extent = -1
        dim_to_split = -1
        for d in range(self.ndim - 1, -1, -1):
            size = self.shape[d]
            if size == 0:
                continue
            for st in self.strides:
                extent = (size - 1) * abs(st[d])
                if extent > max_extent:
                    max_extent = extent
                    dim_to_split = d
        return dim_to_split

    def narrow(self, dim: int, start: int, size: int) -> None:
        """``TensorIteratorBase::narrow`` (reductions are not re-coalesced)."""
        self.shape[dim] = size
        for i, st in enumerate(self.strides):
            self.offsets[i] += st[dim] * start

    def split(self, dim: int) -> _ReductionIter:
        """``TensorIteratorBase::split``: returns the first half; ``self`` keeps the rest."""
        copy = self.copy()
        copy_size = self.shape[dim] // 2
        this_size = self.shape[dim] - copy_size
        copy.narrow(dim, 0, copy_size)
        self.narrow(dim, copy_size, this_size)
        return copy

    def with_32bit_indexing(self) -> list[_ReductionIter]:
        """``SplitUntil32Bit``: the sub-iterators, in the order ``gpu_reduce_kernel`` runs them."""
        out: list[_ReductionIter] = []
        vec = [self.copy()]
        while vec:
            while vec and not vec[-1].can_use_32bit_indexing():
                it = vec[-1]
                vec.append(it.split(it.get_dim_to_split()))
            if not vec:
                break
            out.append(vec.pop())
        return out


def _build_reduction_iter(
    shape: Sequence[int],
    strides: Sequence[int],
    reduce_dims: Sequence[int],
    input_itemsize: int,
    output_itemsizes: Sequence[int],
    input_offset: int,
) -> _ReductionIter:
    """``TensorIterator::reduce_op(viewed_result, self)`` without the fast path (reductions
    never take it): ``compute_shape``, ``compute_strides``, ``reorder_dimensions``,
    ``coalesce_dimensions`` (TensorIterator.cpp)."""
    ndim = len(shape)
    if len(strides) != ndim:
        raise ValueError(f"shape {tuple(shape)} and strides {tuple(strides)} differ in length")
    mask = [False] * ndim
    for d in reduce_dims:
        if not -ndim <= d < max(ndim, 1):
            raise ValueError(f"reduce dim {d} out of range for {ndim} dims")
        if ndim:
            mask[d % ndim] = True
    if ndim and not list(reduce_dims):  # dim=None / dim=[]: every dim is reduced
        mask = [True] * ndim

    # The output: resize_reduction makes it contiguous over the kept dims;
    # review_reduce_result views it with size 1, stride 0 in each reduced dim (keepdim=False).
    out_elem_strides = [0] * ndim
    running = 1
    for d in range(ndim - 1, -1, -1):
        if not mask[d]:
            out_elem_strides[d] = running
            running *= shape[d]
    operands: list[list[int]] = []
    for isz in output_itemsizes:
        # (compute_strides would also zero a size-1 output dim broadcast against a larger
        # input dim; the viewed output has those only in reduced dims, already 0)
        operands.append([0 if mask[d] else out_elem_strides[d] * isz for d in range(ndim)])
    operands.append([s * input_itemsize for s in strides])
    noutputs = len(output_itemsizes)
    shp = list(shape)

    # reorder_dimensions
    if ndim > 1:
        perm = list(range(ndim - 1, -1, -1))

        def should_swap(dim0: int, dim1: int) -> int:
            for arg, st in enumerate(operands):
                stride0, stride1 = st[dim0], st[dim1]
                if arg < noutputs and (stride0 == 0) != (stride1 == 0):
                    # move reduced dimensions to the front
                    return 1 if stride1 == 0 else -1
                if stride0 == 0 or stride1 == 0:
                    continue
                if stride0 < stride1:
                    return -1
                if stride0 > stride1:
                    return 1
                if shp[dim0] > shp[dim1]:
                    return 1
            return 0

        for i in range(1, ndim):
            dim1 = i
            for dim0 in range(i - 1, -1, -1):
                comparison = should_swap(perm[dim0], perm[dim1])
                if comparison > 0:
                    perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                    dim1 = dim0
                elif comparison < 0:
                    break
        shp = [shp[p] for p in perm]
        operands = [[st[p] for p in perm] for st in operands]

    # coalesce_dimensions
    if len(shp) > 1:

        def can_coalesce(d0: int, d1: int) -> bool:
            if shp[d0] == 1 or shp[d1] == 1:
                return True
            return all(shp[d0] * st[d0] == st[d1] for st in operands)

        def replace_stride(d0: int, d1: int) -> None:
            for st in operands:
                st[d0] = st[d1]

        prev_dim = 0
        for dim in range(1, len(shp)):
            if can_coalesce(prev_dim, dim):
                if shp[prev_dim] == 1:
                    replace_stride(prev_dim, dim)
                shp[prev_dim] *= shp[dim]
            else:
                prev_dim += 1
                if prev_dim != dim:
                    replace_stride(prev_dim, dim)
                    shp[prev_dim] = shp[dim]
        shp = shp[: prev_dim + 1]
        operands = [st[: prev_dim + 1] for st in operands]

    offsets = [0] * noutputs + [input_offset]
    return _ReductionIter(shp, operands, noutputs, offsets)


# --------------------------------------------------------------------------- setReduceConfig
def _get_output_vec_size(it: _ReductionIter, scalar_size: int) -> int:
    """``get_output_vec_size<scalar_t>`` (Reduce.cuh)."""
    vec_size = 4

    def update(n: int) -> None:
        nonlocal vec_size
        while n % vec_size != 0:
            vec_size //= 2

    update(it.offsets[it.noutputs] // scalar_size)  # base address / sizeof(scalar_t)
    output_index = it.num_reduce_dims()
    update(it.shape[output_index])
    for j, s in enumerate(it.strides[it.noutputs]):
        if j != output_index:
            update(s // scalar_size)
    return vec_size


def _set_reduce_config(
    it: _ReductionIter,
    arg_size: int,
    scalar_size: int,
    vt0: int,
    input_vec_size: int,
    sm_count: int,
    max_threads_per_sm: int,
    version: tuple[int, int],
) -> ReduceConfig:
    """``setReduceConfig<arg_t, scalar_t, vt0, input_vec_size>`` (Reduce.cuh), CUDA path."""
    num_outputs = it.num_output_elements()
    inputs_per_output = it.numel() // num_outputs
    input_index = it.ntensors - 1
    config = ReduceConfig(element_size_bytes=arg_size, num_inputs=inputs_per_output, num_outputs=num_outputs)

    in_strides = it.strides[input_index]
    nrd = it.num_reduce_dims()
    if it.ndim > 0:
        reduction_on_fastest_striding_dimension = nrd == it.ndim or in_strides[0] < in_strides[nrd]
        if reduction_on_fastest_striding_dimension:
            dim0, dim1 = inputs_per_output, num_outputs
            fastest_moving_stride = in_strides[0]
        else:
            dim0, dim1 = num_outputs, inputs_per_output
            fastest_moving_stride = in_strides[nrd]
    else:
        reduction_on_fastest_striding_dimension = True
        fastest_moving_stride = scalar_size
        dim0 = dim1 = 1

    if fastest_moving_stride == scalar_size:
        if version < (2, 7):  # v2.6: ReduceConfig::input_vec_size == 4
            vec_in = reduction_on_fastest_striding_dimension and dim0 > 128 and nrd == 1 and vt0 >= 4
            ivs = 4
        elif version < (2, 10):  # v2.7 .. v2.9
            vec_in = reduction_on_fastest_striding_dimension and dim0 > 128 and nrd == 1 and vt0 >= input_vec_size
            ivs = input_vec_size
        else:  # v2.10 on
            vec_in = reduction_on_fastest_striding_dimension and dim0 >= 128 and nrd == 1
            ivs = input_vec_size
        if vec_in:
            # Case 1: "vectorize along input"
            config.vectorize_input = True
            dim0 //= ivs
        elif not reduction_on_fastest_striding_dimension:
            # Case 2: "vectorize along output"
            config.output_vec_size = _get_output_vec_size(it, scalar_size)
            dim0 //= config.output_vec_size

    # mnt_wrapper<scalar_t>::MAX_NUM_THREADS: 256 for c10::complex<double> (16 bytes), else 512
    config.set_block_dimension(dim0, dim1, 256 if scalar_size == 16 else 512)
    block_width, block_height = config.block_width, config.block_height

    if it.ndim == 0 or reduction_on_fastest_striding_dimension:
        config.input_mult[0] = config.split_input(block_width)
    else:
        config.output_mult[0] = config.split_output(block_width)

    min_values_per_thread = 16
    max_values_per_thread = 256
    warp_split_threshold = min(block_height * 16, max_values_per_thread)
    if config.values_per_thread() >= warp_split_threshold:
        config.input_mult[1] = config.split_input(block_height)
    else:
        config.output_mult[1] = config.split_output(block_height)

    blocks_per_sm = max_threads_per_sm // config.num_threads
    target_grid_size = sm_count * blocks_per_sm
    grid = config.grid()[0]
    if (config.input_mult[1] != 0 and config.values_per_thread() >= max_values_per_thread
            and grid <= target_grid_size):
        ctas_per_output1 = _div_up(target_grid_size, grid)
        ctas_per_output2 = _div_up(config.values_per_thread(), min_values_per_thread)
        ctas_per_output3 = _div_up(config.values_per_thread(), max_values_per_thread)
        # v2.14: std::clamp(c1, c3, c2); before: max(min(c1, c2), c3) -- the same, as c3 <= c2
        config.ctas_per_output = max(min(ctas_per_output1, ctas_per_output2), ctas_per_output3)
        if config.ctas_per_output > 1:
            config.input_mult[2] = config.split_input(config.ctas_per_output)
    return config


# --------------------------------------------------------------------------- public API
@dataclass(frozen=True)
class ReducePlan:
    """Everything one reduction op allocates inside ``gpu_reduce_kernel``.

    ``launches`` holds one entry per kernel launch: one, unless the iteration needs 64-bit
    indexing (an operand spans more than 2**31 - 1 bytes or there are more than 2**31 - 1
    elements), when ``with_32bit_indexing`` splits it into sub-launches run one after the
    other. ``accumulation_bytes`` is the ``AccumulationBuffer`` that such a split allocates
    first (and frees last) when the output type cannot hold the accumulator (e.g. bfloat16
    output of a float accumulation, or the (value, index) pairs of ``max(dim)``)."""

    launches: tuple[ReduceBuffers, ...]
    accumulation_bytes: int = 0

    def steps(self) -> list[tuple[str, str, int]]:
        """The allocations in the order the kernel makes them, as ``("alloc", slot, nbytes)``
        / ``("free", slot, 0)`` (the step format of ``cuda_temporaries``)."""
        out: list[tuple[str, str, int]] = []
        if self.accumulation_bytes:
            out.append(("alloc", "acc_buffer", self.accumulation_bytes))
        for k, b in enumerate(self.launches):
            if b.buffer_bytes:
                out += [("alloc", f"reduce_buffer{k}", b.buffer_bytes),
                        ("alloc", f"reduce_semaphores{k}", b.semaphore_bytes),
                        ("free", f"reduce_semaphores{k}", 0),
                        ("free", f"reduce_buffer{k}", 0)]
        if self.accumulation_bytes:
            out.append(("free", "acc_buffer", 0))
        return out


def _itemsizes(output_itemsize: int | Sequence[int]) -> list[int]:
    if isinstance(output_itemsize, int):
        return [output_itemsize]
    sizes = [int(s) for s in output_itemsize]
    if not sizes:
        raise ValueError("a reduction has at least one output")
    return sizes


def reduce_config(
    shape: Sequence[int],
    strides: Sequence[int],
    reduce_dims: Sequence[int],
    input_itemsize: int,
    acc_itemsize: int,
    output_itemsize: int | Sequence[int],
    sm_count: int,
    max_threads_per_sm: int,
    vt0: int = 4,
    input_vec_size: int | None = None,
    torch_version: str | tuple[int, ...] | None = None,
    input_offset: int = 0,
) -> list[ReduceConfig]:
    """The ``ReduceConfig`` of each launch (one unless the 32-bit split applies); arguments
    as for :func:`reduce_plan`."""
    return [cfg for cfg, _ in _configs(shape, strides, reduce_dims, input_itemsize, acc_itemsize,
                                       output_itemsize, sm_count, max_threads_per_sm, vt0,
                                       input_vec_size, torch_version, input_offset)[0]]


def _configs(shape, strides, reduce_dims, input_itemsize, acc_itemsize, output_itemsize, sm_count,
             max_threads_per_sm, vt0, input_vec_size, torch_version, input_offset):
    out_sizes = _itemsizes(output_itemsize)
    version = _version(torch_version)
    ivs = vt0 if input_vec_size is None else input_vec_size
    it = _build_reduction_iter(shape, strides, reduce_dims, input_itemsize, out_sizes,
                               input_offset * input_itemsize)
    if it.numel() == 0:
        return [], 0  # empty reductions fill the output and launch nothing
    acc_bytes = 0
    subs = [it]
    if not it.can_use_32bit_indexing():
        # gpu_reduce_kernel: AccumulationBuffer when !can_accumulate_in_output; it allocates
        # only when sizeof(out_scalar_t) < sizeof(arg_t), which is also exactly when the
        # output cannot accumulate for the ops above (half/bfloat16 outputs of a float
        # accumulator, pairs).
        if out_sizes[0] < acc_itemsize:
            out_mem = out_sizes[0]
            for d in range(it.ndim):
                out_mem = max(out_mem, it.shape[d] * it.strides[0][d])
            out_mem //= out_sizes[0]
            acc_bytes = out_mem * acc_itemsize
        subs = it.with_32bit_indexing()
    cfgs = [(_set_reduce_config(s, acc_itemsize, input_itemsize, vt0, ivs, sm_count, max_threads_per_sm,
                                version), s) for s in subs]
    return cfgs, acc_bytes


def reduce_plan(
    shape: Sequence[int],
    strides: Sequence[int],
    reduce_dims: Sequence[int],
    input_itemsize: int,
    acc_itemsize: int,
    output_itemsize: int | Sequence[int],
    sm_count: int,
    max_threads_per_sm: int,
    vt0: int = 4,
    input_vec_size: int | None = None,
    torch_version: str | tuple[int, ...] | None = None,
    input_offset: int = 0,
) -> ReducePlan:
    """What ``gpu_reduce_kernel`` allocates for one reduction on a CUDA GPU.

    shape, strides: the input tensor's (strides in elements; broadcast stride 0 allowed).
    reduce_dims: the reduced dims (negative allowed; empty = all dims, as for ``dim=None``).
        The output is taken as ``resize_reduction`` makes it: contiguous, whether or not
        keepdim (a difference only for size-1 reduced dims, which coalescing drops anyway).
    input_itemsize: ``sizeof(scalar_t)``, the element size of the tensor the kernel reads
        (e.g. 2 for a bfloat16 input summed into float32).
    acc_itemsize: ``sizeof(arg_t)``, the reduction's accumulator (:func:`kernel_params`).
    output_itemsize: the output's element size, or one per output (``max(dim)``: ``(4, 8)``
        for float32 values and int64 indices); matters only for the 64-bit-index split.
    sm_count, max_threads_per_sm: ``cudaDeviceProp::multiProcessorCount`` and
        ``maxThreadsPerMultiProcessor`` (H100 SXM: 132, 2048; A100: 108, 2048;
        RTX 4090: 128, 1536).
    vt0, input_vec_size: the kernel's template arguments (:func:`kernel_params`);
        ``input_vec_size`` defaults to ``vt0``.
    torch_version: e.g. "2.6.0"; None means the newest rules (v2.10 on).
    input_offset: the input's ``storage_offset`` in elements; the data pointer's alignment
        (mod 4 elements) can lower the output vectorization (``get_output_vec_size``). Blocks
        of the caching allocator are 512-byte aligned, so 0 is right for a fresh tensor.
    """
    cfgs, acc_bytes = _configs(shape, strides, reduce_dims, input_itemsize, acc_itemsize, output_itemsize,
                               sm_count, max_threads_per_sm, vt0, input_vec_size, torch_version, input_offset)
    return ReducePlan(tuple(c.buffers() for c, _ in cfgs), acc_bytes)


def reduce_buffers(
    shape: Sequence[int],
    strides: Sequence[int],
    reduce_dims: Sequence[int],
    input_itemsize: int,
    acc_itemsize: int,
    output_itemsize: int | Sequence[int],
    sm_count: int,
    max_threads_per_sm: int,
    vt0: int = 4,
    input_vec_size: int | None = None,
    torch_version: str | tuple[int, ...] | None = None,
    input_offset: int = 0,
) -> ReduceBuffers:
    """The staging buffer and semaphores ``gpu_reduce_kernel`` allocates for one reduction
    (arguments as for :func:`reduce_plan`). For an iteration split into several launches
    (more than 2**31 - 1 bytes), the launch with the largest buffer (each launch frees its own
    before the next starts); :func:`reduce_plan` lists them all."""
    plan = reduce_plan(shape, strides, reduce_dims, input_itemsize, acc_itemsize, output_itemsize,
                       sm_count, max_threads_per_sm, vt0, input_vec_size, torch_version, input_offset)
    if not plan.launches:
        return ReduceBuffers(0, 0)
    return max(plan.launches, key=lambda b: (b.buffer_bytes, b.semaphore_bytes))


# --------------------------------------------------------------------------- per-op parameters
_ITEMSIZE = {
    "bool": 1, "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8,
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "complex64": 8, "complex128": 16,
}
_ALIASES = {"half": "float16", "float": "float32", "double": "float64", "long": "int64", "int": "int32",
            "short": "int16", "cfloat": "complex64", "cdouble": "complex128", "complex32": "complex32"}


def _dtype_name(dtype: object) -> str:
    name = str(dtype).replace("torch.", "")
    return _ALIASES.get(name, name)


def _acc_size(name: str) -> int:
    """``at::acc_type<scalar_t, /*is_cuda=*/true>`` size (real part for complex norms)."""
    if name in ("float16", "bfloat16", "float32"):
        return 4
    if name in ("float64",):
        return 8
    if name in ("complex64",):
        return 8
    if name in ("complex128",):
        return 16
    return 8  # integers accumulate in int64


def kernel_params(op: str, dtype: object, torch_version: str | tuple[int, ...] | None = None) -> tuple[int, int, int]:
    """``(vt0, input_vec_size, acc_itemsize)`` of the ``gpu_reduce_kernel`` instance that
    ``op`` runs on an input of ``dtype`` (a torch dtype or its name), from the kernel symbols
    of the release wheels (v2.6.0 .. v2.14.1) and the ops' ``arg_t``:

    * "sum", "mean": ``sum_functor`` / ``MeanOps``, accumulator ``acc_type`` (float for
      16-bit floats); ``input_vec_size`` 8 for 2-byte inputs from v2.10 on, else 4.
    * "nansum", "prod", "norm" (``linalg_vector_norm``, ``norm``; real accumulator),
      "amax"/"amin" and full ``max()``/``min()`` (``MaxNanFunctor``: accumulator = input).
    * "max_dim"/"min_dim" (``MaxOps``/``MinOps``) and "argmax"/"argmin": a
      ``pair<value, int64_t>`` accumulator, 16 bytes.
    * "aminmax": ``pair<scalar_t, scalar_t>``.
    * "var", "std", "var_mean", "std_mean" (``WelfordOps``, vt0 = 2):
      ``WelfordData<acc, int>``, 16 bytes for float, 32 for double.
    * "any", "all": bool accumulator.
    """
    name = _dtype_name(dtype)
    itemsize = _ITEMSIZE.get(name)
    if itemsize is None:
        raise ValueError(f"unknown dtype {dtype!r}")
    version = _version(torch_version)
    if op in ("sum", "mean"):
        ivs = 8 if (itemsize == 2 and version >= (2, 10)) else 4
        return 4, ivs, _acc_size(name)
    if op in ("nansum", "prod"):
        return 4, 4, _acc_size(name)
    if op == "norm":
        acc = {"complex64": 4, "complex128": 8}.get(name, _acc_size(name))
        return 4, 4, acc
    if op in ("amax", "amin", "max", "min"):
        return 4, 4, itemsize
    if op in ("max_dim", "min_dim", "argmax", "argmin"):
        return 4, 4, 16
    if op == "aminmax":
        return 4, 4, 2 * itemsize
    if op in ("var", "std", "var_mean", "std_mean"):
        return 2, 2, 32 if name in ("float64", "complex128") else 16
    if op in ("any", "all"):
        return 4, 4, 1
    raise ValueError(f"unknown reduction op {op!r}")
