"""What Inductor's Triton autotuning allocates at each kernel's first launch on the GPU.

A kernel Inductor generates is a ``CachingAutotuner`` holding the configs its heuristic chose
(``triton_heuristics.pointwise`` / ``reduction`` / ``persistent_reduction``...: two for a 1-D
pointwise kernel unless deterministic algorithms are on, up to a handful for reductions). At
its first launch, one with more than one config times each (``autotune_to_one_config`` ->
``benchmark_all_configs`` -> ``bench``), and timing allocates on the device:

* a copy of every argument the kernel writes in place (``mutated_arg_names``), made for each
  timed call so the timings cannot corrupt it (``maybe_clone_args``, ``clone_preserve_strides``:
  the span the strides reach). A backward or inference graph (``optimize_mem``) copies an
  argument to the host instead when its copy would raise the peak (``copy_args_to_cpu_if_needed``:
  budget ``max_memory_allocated() - memory_allocated()``);
* an int32 buffer, zeroed between timed calls to flush the cache: L2-sized where Inductor
  times with its own benchmarker (``InductorBenchmarker.benchmark_gpu``:
  ``torch.empty(L2_cache_size // 4, dtype=torch.int)``; torch 2.13 and 2.14), 256 MiB where it
  times with Triton's ``do_bench`` (``TritonBenchmarker``: torch 2.6 and 2.10;
  ``get_empty_cache_for_benchmark``). Which one is the installed torch's (:func:`flush_bytes`).

Both are freed when the timing ends; the caching allocator keeps their blocks. Measured on an
H200 (benchmarks/data/gpu_groundtruth-nvidia-h200-*.jsonl, the compiled GPT-2 run): copies of the
823 MB logits and 60 MiB flush buffers in the first step, 0.9 GiB of reserved memory that the
compiled graph's own buffers never needed. The configs are read by calling the kernel's own
heuristic (its decorator, from the generated source) with ``cached_autotune`` swapped for a
recorder: nothing is compiled. A machine whose Inductor cache already holds the kernel's best
config (``autotune_local_cache``, a second run of the same code) skips the timing; the estimate
keeps it, as a first run pays it.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from xmem_engine.tracing.patches import patched_attr


@dataclass(frozen=True)
class Autotune:
    """One generated kernel's autotuning, as far as memory goes."""

    configs: int
    arg_names: tuple[str, ...]
    mutated: frozenset[str]
    optimize_mem: bool


def kernel_def(name: str, source: str) -> ast.FunctionDef | None:
    """The definition of kernel ``name`` in generated ``source``; None where there is none."""
    try:
        return next((n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    except SyntaxError:
        return None


def autotune_of(name: str, source: str) -> Autotune | None:
    """The configs and written arguments of kernel ``name`` in Inductor's generated ``source``;
    None when the source is not one Inductor's heuristics made (a user's kernel, a template)."""
    from torch._inductor.runtime import hints, triton_heuristics

    fn = kernel_def(name, source)
    if fn is None:
        return None
    deco = next((d for d in fn.decorator_list if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute)
                 and isinstance(d.func.value, ast.Name) and d.func.value.id == "triton_heuristics"), None)
    if deco is None:
        return None
    seen: dict[str, Any] = {}

    def record(size_hints: Any, configs: list, triton_meta: dict, heuristic_type: Any = None, *args: Any,
               inductor_meta: dict | None = None, **kwargs: Any) -> Any:
        seen.update(configs=configs, meta=inductor_meta or {})
        return lambda fn: fn

    names = {"triton_heuristics": triton_heuristics, "__file__": f"{name}.py",
             **{k: getattr(hints, k) for k in ("DeviceProperties", "ReductionHint", "TileHint", "AutotuneHint")
                if hasattr(hints, k)}}
    if "AttrsDescriptor" in source:  # torch < 2.7 spells Triton's argument properties with it
        try:
            from triton.compiler.compiler import AttrsDescriptor
        except ImportError:  # this Triton has none: the source is another version's
            return None
        names["AttrsDescriptor"] = AttrsDescriptor
    try:
        with patched_attr(triton_heuristics, "cached_autotune", record):
            eval(compile(ast.Expression(deco), f"<{name}>", "eval"), names)(None)
    except Exception:  # noqa: BLE001 - a heuristic this torch spells differently: no autotuning modelled
        return None
    if "configs" not in seen:
        return None
    meta = seen["meta"]
    return Autotune(len(seen["configs"]), tuple(a.arg for a in fn.args.args),
                    frozenset(meta.get("mutated_arg_names") or ()), bool(meta.get("optimize_mem", True)))


#: Triton's ``do_bench`` cache-flush buffer (``get_empty_cache_for_benchmark``: 256 MiB of int32)
TRITON_FLUSH_BYTES = 256 * 1024 * 1024


def flush_bytes(l2_cache_bytes: int) -> int:
    """The cache-flush buffer this torch's Inductor allocates before each timed launch: the
    GPU's L2 size with its own benchmarker, Triton's fixed 256 MiB with Triton's (the kk compiled
    recording, torch 2.6: 37 buffers of 268,435,456 B)."""
    from torch._inductor.runtime import benchmarking

    if type(benchmarking.benchmarker).__name__ == "TritonBenchmarker":
        return TRITON_FLUSH_BYTES
    return l2_cache_bytes


def _span(t: torch.Tensor) -> int:
    """Elements ``clone_preserve_strides`` copies: as far as the strides reach."""
    if t.numel() == 0:
        return 0
    return sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1


def timed_calls(copies: Callable[[], list], flush: int) -> None:
    """What timing a kernel keeps alive on the (virtual) GPU, as Triton's and Inductor's
    benchmarkers run it: a warm-up call's copies of its arguments, then the cache-flush buffer
    (int32) and a timed call's copies beside it; all freed at the end. Every further call and
    config allocates the same sizes again, from the blocks the caching allocator kept."""
    made = copies()
    del made
    buffer = torch.empty(flush // 4, dtype=torch.int32, device="cuda")
    made = copies()
    del made, buffer


def benchmark_allocations(tune: Autotune, args: tuple, flush: int) -> None:
    """Allocate and free on the (virtual) GPU what timing ``tune``'s configs would. Called at the
    kernel's first launch, under the device mode."""
    written = [a for n, a in zip(tune.arg_names, args) if n in tune.mutated and isinstance(a, torch.Tensor)
               and a.device.type == "cuda"]
    if tune.optimize_mem and written:
        budget = torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()
        kept = []
        for a in written:
            size = _span(a) * a.element_size()
            if size <= budget:  # else copied to the host, outside the device's memory
                budget -= size
                kept.append(a)
        written = kept

    timed_calls(lambda: [torch.empty(_span(a), dtype=a.dtype, device=a.device) for a in written], flush)


def pad_mm_timing(mat1: Any, mat2: Any, op: Any, input: Any, flush: int) -> list[tuple[str, str, int]]:
    """The allocations of pad_mm's timing of one matmul while Inductor compiles (``_should_pad``):
    real random copies of its inputs (``realize_tensor``), then ``benchmark_gpu`` of the unpadded
    op (its output, the cache-flush buffer) and of the padded one (inputs padded to the alignment,
    a padded output). As ``("alloc" | "free", slot, bytes)`` steps for ``Tracer.transients``.
    Measured on an H200 for GPT-2's head (768 x 50,257 weight): 77,194,752 B and 77,205,504 B
    copies, 823,410,688 B and 823,525,376 B outputs, 62,914,560 B flush buffers."""
    from torch._inductor.fx_passes.pad_mm import get_alignment_size, get_padded_length

    def nbytes(shape: Any, dtype: torch.dtype) -> int:
        return math.prod(int(s) for s in shape) * dtype.itemsize

    dtype = mat1.dtype
    if op is torch.ops.aten.bmm:
        b, (m, k), n = int(mat1.shape[0]), mat1.shape[1:], int(mat2.shape[2])
    else:
        b, (m, k), n = 1, mat1.shape, int(mat2.shape[1])
    m, k = int(m), int(k)
    pm, pk = get_padded_length(m, get_alignment_size(mat1)), get_padded_length(k, get_alignment_size(mat1))
    pn = get_padded_length(n, get_alignment_size(mat2))
    lead = (b,) if op is torch.ops.aten.bmm else ()
    steps = [("alloc", "mat1", nbytes((*lead, m, k), dtype)), ("alloc", "mat2", nbytes((*lead, k, n), mat2.dtype))]
    if op is torch.ops.aten.addmm and input is not None:
        steps.append(("alloc", "input", nbytes(input.shape, input.dtype)))
    out, out_pad = nbytes((*lead, m, n), dtype), nbytes((*lead, m + pm, n + pn), dtype)
    for name, size in (("out", out), ("out_pad", out_pad)):
        pads = []
        if name == "out_pad":
            if pm or pk:
                pads.append(("mat1_pad", nbytes((*lead, m + pm, k + pk), dtype)))
            if pk or pn:
                pads.append(("mat2_pad", nbytes((*lead, k + pk, n + pn), mat2.dtype)))
        call = [*(("alloc", s, z) for s, z in pads), ("alloc", name, size), ("free", name, 0),
                *(("free", s, 0) for s, _ in pads)]
        steps += call + [("alloc", "flush", flush)] + call + [("free", "flush", 0)]
    steps += [("free", "mat1", 0), ("free", "mat2", 0)]
    if op is torch.ops.aten.addmm and input is not None:
        steps.append(("free", "input", 0))
    return steps


def pad_mm_should_pad(timed: Any, flush: int) -> Any:
    """pad_mm's ``_should_pad`` (``_should_pad_bench`` in torch 2.10) on the virtual GPU: its own
    rules up to the timing; then what the timing allocates is handed to ``timed`` (a list of
    steps), and half-precision matmuls are padded, as the timing chose on an H200 for GPT-2's
    head (tensor cores want dimensions in multiples of 8; float32 ones are left as they are)."""
    from torch._inductor import config
    from torch._inductor.fx_passes import pad_mm

    def should_pad(match: Any, mat1: Any, mat2: Any, op: Any, input: Any = None) -> bool:
        aten = torch.ops.aten
        if op is aten.mm or op is aten.addmm:
            m, k, n = mat1.shape[0], mat1.shape[1], mat2.shape[1]
        elif op is aten.bmm:
            m, k, n = mat1.shape[1], mat1.shape[2], mat2.shape[2]
        else:
            return False
        if config.force_shape_pad:
            return True
        if not all(isinstance(d, int) for d in (m, k, n)):
            return False  # symbolic sizes: no hint to time with here
        if not any(pad_mm.get_padded_length(d, pad_mm.get_alignment_size(t))
                   for d, t in ((m, mat1), (k, mat1), (n, mat2))):
            return False  # aligned already: nothing to time
        if ("pad_aten_mm_pass" in config.post_grad_fusion_options
                and pad_mm.should_pad_mm_bf16(mat1.dtype, m, n, k)):
            return True
        try:
            if not pad_mm.is_mm_compute_bound(m, k, n, mat1.dtype):
                return False
        except Exception:  # noqa: BLE001 - a torch whose rule asks something the virtual GPU lacks
            return False
        if getattr(config, "deterministic", False):
            return False
        timed(pad_mm_timing(mat1, mat2, op, input, flush))
        return mat1.dtype in (torch.float16, torch.bfloat16)

    return should_pad
