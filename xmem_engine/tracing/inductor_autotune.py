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
* an L2-sized int32 buffer, zeroed between timed calls to flush the cache
  (``InductorBenchmarker.benchmark_gpu``: ``torch.empty(L2_cache_size // 4, dtype=torch.int)``).

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
from dataclasses import dataclass
from typing import Any

import torch

from xmem_engine.tracing.patches import patched_attr


@dataclass(frozen=True)
class Autotune:
    """One generated kernel's autotuning, as far as memory goes."""

    configs: int
    arg_names: tuple[str, ...]
    mutated: frozenset[str]
    optimize_mem: bool


def autotune_of(name: str, source: str) -> Autotune | None:
    """The configs and written arguments of kernel ``name`` in Inductor's generated ``source``;
    None when the source is not one Inductor's heuristics made (a user's kernel, a template)."""
    from torch._inductor.runtime import hints, triton_heuristics

    try:
        fn = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name)
    except (StopIteration, SyntaxError):
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


def _span(t: torch.Tensor) -> int:
    """Elements ``clone_preserve_strides`` copies: as far as the strides reach."""
    if t.numel() == 0:
        return 0
    return sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1


def benchmark_allocations(tune: Autotune, args: tuple, l2_cache_bytes: int) -> int:
    """Allocate and free on the (virtual) GPU what timing ``tune``'s configs would; returns the
    bytes of argument copies made. Called at the kernel's first launch, under the device mode."""
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

    def timed_call() -> None:
        copies = [torch.empty(_span(a), dtype=a.dtype, device=a.device) for a in written]
        del copies

    timed_call()  # the warm-up call, before the flush buffer
    flush = torch.empty(l2_cache_bytes // 4, dtype=torch.int32, device="cuda")
    timed_call()
    del flush
    return sum(_span(a) * a.element_size() for a in written)
