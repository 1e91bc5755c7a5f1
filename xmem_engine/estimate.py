"""The estimate: how much GPU memory a training step needs on a named GPU.

``estimate(code, gpu=...)`` traces the code on the CPU (``tracing/``), re-creates what a CUDA
run does differently (``gpus/cuda_libraries.py``), replays the requests through the caching
allocator on the target GPU (``simulation/``) and returns an :class:`Estimate`: plain data that
the CLI prints, the notebook widget draws, and :meth:`Estimate.to_report` saves.

Device memory, as ``nvidia-smi`` would show it for the process::

    peak_device_bytes = context_bytes + outside_allocator_bytes + peak_reserved_bytes

``context_bytes`` is the CUDA context (per GPU, from the catalog); ``outside_allocator_bytes``
is library memory that does not pass through PyTorch's allocator: the kernels (PyTorch's,
cuBLAS's) a step loads on first use, cuDNN's and NCCL's once it uses them (``gpus/fixed_memory.py``).
The allocator may reserve at most what remains. NVML's total - free reads more: ``Estimate.readings``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from xmem_engine.calibration import PeakRange, peak_range
from xmem_engine.gpus.fixed_memory import FixedMemory, Readings, fixed_memory as fixed_memory_of
from xmem_engine.simulation.alloc_conf import AllocatorConfig, parse_alloc_conf, require_native
from xmem_engine.simulation.allocator import CachingAllocator
from xmem_engine.gpus import GPU, get_gpu, load_catalog
from xmem_engine.inputs import DEFAULT_GPU
from xmem_engine.simulation.simulate import SimulationResult, simulate
from xmem_engine.trace import ALLOC, ITERATION, Trace, TraceEvent

from xmem_engine.batch_search import REAL_MODE_REACH, SEARCH_LIMIT, BatchSearch, max_batch  # noqa: F401 (API)
from xmem_engine.batch_family import script_branches_on  # noqa: F401 (the CLI's --max-batch asks it)

if TYPE_CHECKING:
    from xmem_engine.tracing.shims.distributed import World

REPORT_MIME = "application/vnd.xmem.report+json"
REPORT_VERSION = 1


@dataclass
class Timeline:
    """Allocated / reserved bytes after each allocation or free, on the trace's event axis."""

    event: list[int]
    allocated: list[int]
    reserved: list[int]
    phases: list[tuple[int, str]]  # (event index, phase that starts there)
    iterations: list[int]  # event index where each iteration starts


@dataclass
class Estimate:
    """One estimate for one GPU, in exact bytes; ``readings``: nvidia-smi's used and NVML v1's total - free."""

    gpu: str  # catalog key, e.g. "A100-SXM4-40GB"
    gpu_name: str  # as nvidia-smi prints it
    capacity_bytes: int  # device memory the driver lets a process use
    context_bytes: int
    outside_allocator_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_device_bytes: int
    fits: bool
    headroom_bytes: int  # capacity - peak device memory (negative: short by that much)
    oom: bool  # the simulated run hit out-of-memory before it finished
    reserved_at_peak_bytes: int  # reserved when allocated peaked (the rest is cached)
    breakdown: dict[str, int]  # category -> bytes live at the peak
    breakdown_by_module: dict[str, int]  # top modules -> bytes live at the peak
    top_tensors: list[dict]  # the largest tensors live at the peak
    timeline: Timeline
    mode: str  # trace mode used: fake / real
    n_events: int
    alloc_conf: str
    torch_version: str
    seconds: float  # whole estimate
    trace_seconds: float
    simulate_seconds: float
    notes: list[str] = field(default_factory=list)
    allocator_limit_bytes: int = 0  # what cudaMalloc could get: capacity - context - libraries
    min_device_bytes: int | None = None  # least device memory it runs in (minimum_memory); None: not asked
    oom_event: int | None = None  # on this GPU: the event (timeline x) where the run runs out of memory
    # Near the capacity: the peak with memory to spare, above what this GPU shows (None: the same)
    natural_peak_device_bytes: int | None = None
    peak_range: PeakRange | None = None  # the calibrated range around peak_device_bytes (calibration.py)
    # A distributed run: the traced rank's world ({"size", "rank", "gpus_per_node"}); None: one process
    world: dict | None = None
    rank_peaks: dict[int, int] | None = None  # --rank all: each rank's peak device bytes (this is the largest)
    fixed_memory: FixedMemory | None = None  # its parts on this GPU, sources, ranges, driver reserve
    # A loop's first step alone (no optimizer state yet, a cold cache), simulated on its own as
    # this GPU would run it; None for a single step. The headline is every step's peak.
    first_step_peak_device_bytes: int | None = None
    trace: Trace | None = field(default=None, repr=False, compare=False)
    # What the simulation read: the GPU's catalog entry, and the trace's events as a CUDA
    # run on that GPU makes them (library workspaces added): the timeline's x axis.
    target: GPU | None = field(default=None, repr=False, compare=False)
    simulated_events: list[TraceEvent] | None = field(default=None, repr=False, compare=False)

    @property
    def headline(self) -> str:
        """The one-sentence verdict every view shows (the CLI, the widget, the saved report):
        "Peak 3.21 GiB of 7.75 GiB on NVIDIA GeForce RTX 4060 — fits (headroom 4.54 GiB)"."""
        head = f"Peak {gib(self.peak_device_bytes)} of {gib(self.capacity_bytes)} on {self.gpu_name}"
        if self.world and self.world.get("size", 1) > 1:
            who = (f"the largest of {len(self.rank_peaks)} ranks, rank {self.world['rank']}" if self.rank_peaks
                   else f"rank {self.world['rank']}")
            head += f" ({who} of {self.world['size']})"
        if self.fits:
            return f"{head} — fits (headroom {gib(self.headroom_bytes)})"
        if self.headroom_bytes < 0:
            return f"{head} — does not fit (short by {gib(-self.headroom_bytes)})"
        return f"{head} — does not fit (the simulated run runs out of memory)"

    @property
    def headline_detail(self) -> str:
        """The device peak's parts, named as xmem_jupyter/figures.py names them: which peak is which (#35)."""
        tl, top, a = self.timeline, self.peak_reserved_bytes, self.peak_allocated_bytes
        then = max((x for x, r in zip(tl.allocated, tl.reserved) if r == top), default=a)
        more = "" if then == a else f"; allocated peak {gib(a)}, at another moment"
        return (f"CUDA context {gib(self.context_bytes)} + libraries {gib(self.outside_allocator_bytes)} + reserved peak "
                f"{gib(top)} (allocated at the reserved peak {gib(then)}){more}")

    @property
    def steps(self) -> int:
        """Training steps (iterations) the trace ran."""
        return len(self.timeline.iterations)

    @property
    def readings(self) -> Readings:  # the peak as nvidia-smi reads it, and as total - free (NVML v1) does
        return Readings.of(self.peak_device_bytes, self.peak_range, self.fixed_memory)

    @property
    def backend_caveat(self) -> str | None:
        """The note saying attention kept the backend of the GPU it was traced for (a GPU of
        another architecture may pick another, with other memory), or None."""
        return next((n for n in self.notes if n.startswith(SDPA_CAVEAT)), None)

    def resimulate(self, gpu: str | GPU | None = None, alloc_conf: str | AllocatorConfig | None = None) -> "Estimate":
        """The same trace on another GPU or allocator setting (default: this estimate's):
        milliseconds, no re-tracing. What a GPU switch in the widget calls."""
        if self.trace is None:
            raise ValueError("this estimate carries no trace to re-simulate")
        return estimate_trace(self.trace, gpu if gpu is not None else (self.target or self.gpu),
                              alloc_conf if alloc_conf is not None else self.alloc_conf,
                              torch_version=self.torch_version)

    def to_json(self) -> dict:
        """Everything but the trace itself, as JSON-ready data (the ``--json`` output)."""
        return {
            "gpu": self.gpu,
            "gpu_name": self.gpu_name,
            "capacity_bytes": self.capacity_bytes,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "context_bytes": self.context_bytes,
            "outside_allocator_bytes": self.outside_allocator_bytes,
            "peak_device_bytes": self.peak_device_bytes,
            "fits": self.fits,
            "headroom_bytes": self.headroom_bytes,
            "oom": self.oom,
            "reserved_at_peak_bytes": self.reserved_at_peak_bytes,
            "mode": self.mode,
            "seconds": round(self.seconds, 3),
            "trace_seconds": round(self.trace_seconds, 3),
            "simulate_seconds": round(self.simulate_seconds, 3),
            "n_events": self.n_events,
            "alloc_conf": self.alloc_conf,
            "torch_version": self.torch_version,
            "breakdown": self.breakdown,
            "breakdown_by_module": self.breakdown_by_module,
            "top_tensors": self.top_tensors,
            "notes": self.notes,
            "guesses": list(self.trace.meta.get("guesses", ())) if self.trace is not None else [],
            "batch_size_search": list(self.trace.meta.get("batch_size_search", ())) if self.trace is not None else [],
            "min_device_bytes": self.min_device_bytes,
            "oom_event": self.oom_event,
            "headline": self.headline,
            "world": self.world,
            "rank_peaks": {str(k): v for k, v in self.rank_peaks.items()} if self.rank_peaks else None,
            "headline_detail": self.headline_detail,
            "natural_peak_device_bytes": self.natural_peak_device_bytes,
            "steps": self.steps,
            "first_step_peak_device_bytes": self.first_step_peak_device_bytes,
            "peak_device_bytes_low": self.peak_range.low_bytes if self.peak_range else None,
            "peak_device_bytes_high": self.peak_range.high_bytes if self.peak_range else None,
            "range": self.range_text,
            **self.readings.to_json(),
            "fixed_memory": self.fixed_memory.to_json() if self.fixed_memory else None,
        }

    @property
    def safe_bytes(self) -> int:
        """The figure to schedule with: the range's high end (the point estimate without a
        calibration)."""
        return self.peak_range.high_bytes if self.peak_range else self.peak_device_bytes

    @property
    def fits_safely(self) -> bool:
        """Fits with the range's high end too (``--safe``)."""
        return self.fits and self.safe_bytes <= self.capacity_bytes

    @property
    def range_text(self) -> str | None:
        """The range in words (CLI, widget, report), or None without a calibration."""
        return self.peak_range.describe() if self.peak_range else None

    def to_report(self, max_points: int = 2000) -> dict:
        """The saved-notebook report (``application/vnd.xmem.report+json``, schema in
        ``xmem_engine/data/report.schema.json``): the headline, the breakdown and a
        timeline thinned to ``max_points`` samples that keeps every local peak's height."""
        tl = _thin(self.timeline, max_points)
        return {
            "version": REPORT_VERSION,
            **{k: v for k, v in self.to_json().items() if k not in ("top_tensors",)},
            "top_tensors": self.top_tensors[:20],
            "timeline": {
                "event": tl.event,
                "allocated": tl.allocated,
                "reserved": tl.reserved,
                "phases": [list(p) for p in tl.phases],
                "iterations": tl.iterations,
                "peak_event": _peak_index(self.timeline),
            },
        }

    def summary(self) -> str:
        """A few readable lines (the CLI's default output)."""
        gib = 1 << 30
        lines = [self.headline, f"  {self.headline_detail}"]
        first = self.first_step_peak_device_bytes  # shown where it is >= 1% below the steady state's
        if first is not None and self.peak_device_bytes - first >= 0.01 * self.peak_device_bytes:
            lines.append(f"  first-step peak {first / gib:.2f} GiB; peak device memory "
                         f"{self.peak_device_bytes / gib:.2f} GiB over {self.steps} steps, the steady state: later "
                         "steps run on what the first left (the optimizer's state, gradients, the allocator's cache)")
        lines += ([f"  {self.range_text}"] if self.peak_range is not None else []) + [f"  {self.readings.describe()}"]
        lines += [f"  {self.fixed_memory.describe()}"] if self.fixed_memory else []
        if self.min_device_bytes is not None:
            lines.append(f"  runs in as little as {self.min_device_bytes / gib:.2f} GiB: under a tighter cap "
                         "the allocator frees its cache and retries, with no margin for variation")
        parts = ", ".join(f"{k} {v / gib:.2f}" for k, v in self.breakdown.items())
        lines += [f"  at the allocated peak (GiB): {parts}"] if self.breakdown else []
        lines += [f"  traced in {self.mode} mode, {self.n_events:,} events, {self.seconds:.1f} s"]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def gib(n: int) -> str:
    """Bytes as GiB with two decimals: the one unit of the headline and its detail line (the
    CLI, the widget and the saved report show the same words)."""
    return f"{n / (1 << 30):.2f} GiB"


def _peak_index(tl: Timeline) -> int:
    if not tl.allocated:
        return -1
    best = max(range(len(tl.allocated)), key=tl.allocated.__getitem__)
    return tl.event[best]


def _thin(tl: Timeline, max_points: int) -> Timeline:
    """Keep at most ``max_points`` samples, each bucket's highest, so peaks survive."""
    n = len(tl.event)
    if n <= max_points:
        return tl
    step = n / max_points
    keep: list[int] = []
    for b in range(max_points):
        lo, hi = int(b * step), min(n, int((b + 1) * step))
        if hi > lo:
            keep.append(max(range(lo, hi), key=tl.allocated.__getitem__))
    return Timeline([tl.event[i] for i in keep], [tl.allocated[i] for i in keep],
                    [tl.reserved[i] for i in keep], tl.phases, tl.iterations)


def resolve_gpu(gpu: str | GPU, catalog_file: str | Path | None = None) -> GPU:
    if isinstance(gpu, GPU):
        return gpu
    return get_gpu(gpu, load_catalog(catalog_file))


def allocator_limit(gpu: GPU, outside_allocator_bytes: int) -> int:
    """What cudaMalloc can still get: the GPU's usable memory less context and libraries."""
    return max(0, gpu.total_memory_bytes - gpu.context_bytes - outside_allocator_bytes)


def allocator_config(alloc_conf: str | AllocatorConfig | None) -> AllocatorConfig:
    """The allocator settings, checked before any tracing: xmem simulates the native allocator."""
    if isinstance(alloc_conf, AllocatorConfig):
        cfg = alloc_conf
    elif alloc_conf is None:
        cfg = AllocatorConfig.from_env()
    else:
        cfg = parse_alloc_conf(alloc_conf)
    return require_native(cfg)


def _check_target_torch(torch_version: str | None) -> None:
    """A named GPU-side PyTorch release must be one xmem models (ValueError otherwise)."""
    if torch_version is not None:
        from xmem_engine.gpus.cuda_libraries import target_version

        target_version(torch_version)


def estimate(
    code: str | Callable[[], Any],
    gpu: str | GPU = DEFAULT_GPU,
    *,
    namespace: dict | None = None,
    mode: str = "auto",
    alloc_conf: str | AllocatorConfig | None = None,
    torch_version: str | None = None,
    filename: str = "<cell>",
    iterations: int | None = None,
    world: World | None = None,
    steps: int | None = 1,
    compile: str | None = None,
) -> Estimate:
    """Estimate the GPU memory ``code`` (source text or a callable) needs on ``gpu``.

    ``iterations``: stop the code once that many training iterations have run (the peak is
    normally reached by the second), so a long training loop costs two iterations.
    ``steps``: for source text, run its training step this many times, the model and optimizer
    built once (None: the steady state, as ``%%xmem`` does: a code that runs one step runs it
    twice; 1: as written).
    ``world``: estimate one rank of a distributed run (``tracing.distributed.World``).
    ``compile``: "inductor" (``torch.compile`` compiles for the GPU), "eager" (compiled code
    runs eagerly, to see what compiling saves); None: ``$XMEM_COMPILE``, else "inductor".
    """
    from xmem_engine.tracing import trace

    target = resolve_gpu(gpu)
    cfg = allocator_config(alloc_conf)
    _check_target_torch(torch_version)
    t0 = time.perf_counter()
    tr = trace(code, namespace, mode=mode, device=target.properties(), filename=filename,
               max_iterations=iterations, torch_version=torch_version, world=world, steps=steps, compile=compile)
    return estimate_trace(tr, target, cfg, torch_version=torch_version, started=t0)


def estimate_script(
    path: str | Path,
    gpu: str | GPU = DEFAULT_GPU,
    *,
    overrides: dict[str, str] | None = None,
    mode: str = "auto",
    alloc_conf: str | AllocatorConfig | None = None,
    torch_version: str | None = None,
    iterations: int | None = None,
    world: World | None = None,
    argv: list[str] | None = None,
) -> Estimate:
    """Estimate for a training script written for CUDA (``--set`` style ``overrides``);
    ``world``: one rank of a ``torchrun`` launch (``tracing.distributed.World``); ``argv``:
    the script's command-line arguments."""
    from xmem_engine.tracing import trace_script

    target = resolve_gpu(gpu)
    cfg = allocator_config(alloc_conf)
    _check_target_torch(torch_version)
    t0 = time.perf_counter()
    tr = trace_script(path, mode=mode, overrides=overrides, device=target.properties(),
                      max_iterations=iterations, torch_version=torch_version, world=world, argv=argv)
    return estimate_trace(tr, target, cfg, torch_version=torch_version, started=t0)


def estimate_trace(
    tr: Trace,
    gpu: str | GPU,
    alloc_conf: str | AllocatorConfig | None = None,
    *,
    torch_version: str | None = None,
    started: float | None = None,
) -> Estimate:
    """The estimate for an existing trace on ``gpu``: re-simulates, never re-traces.

    This is what a GPU switch in the widget calls; it takes milliseconds.
    """
    from xmem_engine.gpus.cuda_libraries import adapt_trace, gemms_into
    from xmem_engine.tracing.kernels.cuda_temporaries import resized_by_sm
    from xmem_engine.tracing.shims.distributed import NCCL_NOTE  # the tracer's: the code made a process group

    t0 = time.perf_counter()
    target = resolve_gpu(gpu)
    cfg = allocator_config(alloc_conf)
    _check_target_torch(torch_version)
    version = torch_version or torch.__version__.split("+")[0]
    resized = resized_by_sm(tr, target.sm_count, *target.compute_capability)  # reduction buffers, per GPU
    events, notes = adapt_trace(tr if resized is None else Trace(resized, tr.mode, tr.seconds, tr.meta), target,
                                version, gemms=gemms_into(tr))
    traced_cc = tuple(tr.meta.get("compute_capability") or ())
    if tr.meta.get("sdpa_calls") and traced_cc and traced_cc != tuple(target.compute_capability):
        notes = notes + [
            f"{SDPA_CAVEAT} CUDA picks on compute capability "
            f"{traced_cc[0]}.{traced_cc[1]} (the GPU it was traced for); on {target.name} "
            f"({target.compute_capability[0]}.{target.compute_capability[1]}) it may pick another: "
            f"estimate for this GPU directly for its own choice"]
    traced_notes = [str(n) for n in tr.meta.get("notes", ())]
    if tr.meta.get("batch_family"):
        from xmem_engine.batch_family import family_note

        traced_notes.append(family_note(tr.meta))
    fixed = fixed_memory_of(target, tr, process_group=NCCL_NOTE in traced_notes)
    outside = fixed.library_bytes
    limit = allocator_limit(target, outside)
    # Unified memory (bitsandbytes' paged optimizer states): on the device as nvidia-smi counts
    # it, but not taken from cudaMalloc's share, since the driver pages it out when short.
    outside += int(tr.meta.get("managed_bytes", 0))
    sim = simulate(events, allocator=CachingAllocator(cfg, capacity=limit,
                                                     device_total=target.total_memory_bytes))
    # the uncapped peak, where the capped run did not run short (then they are the same)
    known = None if sim.oom or sim.alloc_retries else sim.peak_reserved_bytes
    events, settling = _settle(events, tr, cfg, target, known)
    if settling:
        sim = simulate(events, allocator=CachingAllocator(cfg, capacity=limit, device_total=target.total_memory_bytes))
    oom_note = []
    oom_event = None
    if not any(e.kind == ALLOC for e in tr.events):
        oom_note.append("the code put nothing on cuda: is the model moved with .to('cuda') (or .cuda()), and "
                        "are the inputs created on or moved to the GPU?")
    if sim.oom:
        # The GPU run would stop at the failing request; report what the step needs (an
        # unlimited device), so "short by" says how much is missing.
        oom_note.append(f"on this GPU the run runs out of memory at trace event {sim.oom_event}: {sim.oom_message}")
        oom_event = sim.oom_event
        sim = simulate(events, allocator=CachingAllocator(cfg, capacity=None, device_total=target.total_memory_bytes))
        sim.oom = True
    peak_device = target.context_bytes + outside + sim.peak_reserved_bytes
    first_step = None
    if len(sim.iterations) >= 2:  # the first step as the GPU runs it: it may fit where the loop does not
        head = events[:sim.iterations[1]]
        alone = simulate(head, allocator=CachingAllocator(cfg, capacity=limit, device_total=target.total_memory_bytes))
        if alone.oom:
            alone = simulate(head, allocator=CachingAllocator(cfg, capacity=None, device_total=target.total_memory_bytes))
        first_step = target.context_bytes + outside + alone.peak_reserved_bytes
        grew = _last_step_growth(sim) if len(sim.iterations) >= 3 and not settling else 0  # step 2 grows by design
        if grew >= 64 << 20:
            oom_note.append(f"the allocator reserved {gib(grew)} more in step {len(sim.iterations)} than in the step "
                            "before (its cache had not settled into the loop's pattern): a longer loop may peak "
                            "higher; run more steps (-n) to see where it settles")
    fits = not sim.oom and peak_device <= target.total_memory_bytes
    natural = None
    if not sim.oom and sim.alloc_retries:
        # Near the capacity the allocator freed its cache and retried: what this GPU shows is
        # below the step's natural peak (the peak with memory to spare, e.g. on a larger GPU).
        free = simulate(events, allocator=CachingAllocator(cfg, capacity=None, device_total=target.total_memory_bytes))
        natural = target.context_bytes + outside + free.peak_reserved_bytes
        if natural > peak_device:
            notes = notes + [
                f"near this GPU's capacity the allocator frees its cache and retries "
                f"({sim.alloc_retries} time{'s' if sim.alloc_retries != 1 else ''}): "
                f"nvidia-smi would show {gib(peak_device)} here, where the step's natural peak, with memory to "
                f"spare, is {gib(natural)}"]
        else:
            natural = None
    if sim.workspaces_dropped and not sim.oom:
        n = sim.workspaces_dropped
        notes = notes + [f"{n} cuDNN workspace{'s' if n != 1 else ''} measured for this GPU did not fit here: "
                         f"cuDNN then runs an engine config that needs less (taken as none)"]
    rng = peak_range(tr, peak_device, target.context_bytes, fixed=fixed)
    if fixed.nccl_note():  # included now: the tracer's "not included" note goes
        notes, traced_notes = notes + [fixed.nccl_note()], [n for n in traced_notes if n != NCCL_NOTE]
    t1 = time.perf_counter()
    return Estimate(
        gpu=target.key,
        gpu_name=target.name,
        capacity_bytes=target.total_memory_bytes,
        context_bytes=target.context_bytes,
        outside_allocator_bytes=outside,
        peak_allocated_bytes=sim.peak_allocated_bytes,
        peak_reserved_bytes=sim.peak_reserved_bytes,
        peak_device_bytes=peak_device,
        fits=fits,
        headroom_bytes=target.total_memory_bytes - peak_device,
        oom=sim.oom,
        reserved_at_peak_bytes=sim.reserved_at_peak_bytes,
        breakdown=sim.breakdown,
        breakdown_by_module=_by_module(sim, tr.meta.get("module_types") or {}),
        top_tensors=[_tensor_json(t) for t in sim.live_at_peak[:50]],
        timeline=_timeline(sim, events),
        mode=tr.mode,
        n_events=len(events),
        alloc_conf=cfg.source,
        torch_version=version,
        seconds=(t1 - started) if started is not None else tr.seconds + (t1 - t0),
        trace_seconds=tr.seconds,
        simulate_seconds=t1 - t0,
        notes=notes + settling + oom_note + traced_notes
        + ([str(tr.meta["fallback"])] if tr.meta.get("fallback") else []),
        allocator_limit_bytes=limit,
        oom_event=oom_event,
        natural_peak_device_bytes=natural,
        first_step_peak_device_bytes=first_step,
        peak_range=rng,
        world=dict(tr.meta["world"]) if tr.meta.get("world") else None,
        fixed_memory=fixed,
        trace=tr,
        target=target,
        simulated_events=events,
    )


SDPA_CAVEAT = "scaled_dot_product_attention kept the backends"  # a note's start: see Estimate.backend_caveat
NO_MODULE = "(outside any module)"  # inputs, the loss, the optimizer's own temporaries


def _settle(events: list, tr: Trace, cfg: AllocatorConfig, target: GPU,
            known: int | None = None) -> tuple[list, list[str]]:
    """The steady state's last pass repeated in simulation while the cache keeps growing
    (``simulation/settle.py``), and the note saying so; the events as they were otherwise.
    ``known``: the events' peak reserved bytes on an unlimited device, if simulated already."""
    from xmem_engine.simulation.settle import MAX_EXTRA_STEPS, settled

    span = tr.meta.get("repeat_span")
    if not span or not span[1] > span[0] or span[1] > len(tr.events):
        return events, []
    at = {id(e): i for i, e in enumerate(events)}
    first, last = at.get(id(tr.events[span[0]])), at.get(id(tr.events[span[1] - 1]))
    if first is None or last is None or last < first:
        return events, []

    def peak(evs: list) -> int:
        return simulate(evs, allocator=CachingAllocator(cfg, capacity=None,
                                                        device_total=target.total_memory_bytes)).peak_reserved_bytes

    out, added, grown = settled(events, first, last + 1, peak, known)
    if not added:
        return events, []
    steps = len([e for e in tr.events if e.kind == ITERATION]) + added
    more = " and still growing: a longer loop may peak higher" if added == MAX_EXTRA_STEPS else ""
    return out, [f"the allocator's cache grew after the second step: the step's requests were repeated in "
                 f"simulation ({added} more, {steps} steps) until it settled{more}; {gib(grown)} more reserved "
                 "than over the two traced steps"]


def _last_step_growth(sim: SimulationResult) -> int:
    """How much higher reserved memory went in the last step than in the one before it: zero
    once the cache has settled into the loop's pattern (the steady state). The second step
    grows by design (the optimizer's state meets the activations), so compare from the third."""
    prev, last = sim.iterations[-2], sim.iterations[-1]
    before = [r for e, r in zip(sim.timeline_event, sim.timeline_reserved) if prev <= e < last]
    during = [r for e, r in zip(sim.timeline_event, sim.timeline_reserved) if e >= last]
    return max(0, max(during, default=0) - max(before, default=0))


def _by_module(sim: SimulationResult, types: dict[str, str], top: int = 12) -> dict[str, int]:
    """Bytes live at the peak per module, labelled with the module's class:
    ``layers.0.mlp.fc1 (Linear)``."""
    acc: dict[str, int] = {}
    for t in sim.live_at_peak:
        label = f"{t.module} ({types[t.module]})" if t.module in types else (t.module or NO_MODULE)
        acc[label] = acc.get(label, 0) + t.block_bytes
    return dict(sorted(acc.items(), key=lambda kv: -kv[1])[:top])


def _tensor_json(t) -> dict:
    return {"bytes": t.block_bytes, "requested": t.bytes, "category": t.category, "op": t.op,
            "module": t.module, "phase": t.phase, "shape": list(t.shape), "dtype": t.dtype,
            "source": t.source}


def _timeline(sim: SimulationResult, events) -> Timeline:
    phases: list[tuple[int, str]] = []
    last = None
    for i, e in enumerate(events):
        if e.kind in ("alloc", "free") and e.phase and e.phase != last:
            phases.append((i, e.phase))
            last = e.phase
    return Timeline(list(sim.timeline_event), list(sim.timeline_allocated), list(sim.timeline_reserved),
                    phases, list(sim.iterations))
