"""The named figures of one estimate: each quantity computed and named once, for every view.

The widget's text, the device bar and its tooltips, the charts' labels, the static HTML and
the saved report (``figures`` in ``application/vnd.xmem.report+json``, which the lab
extension draws) all take a figure and its name from :func:`figures`, and print it with
:func:`amount`, so one quantity shows one number under one name wherever a reader meets it.

Two peaks, two moments. The headline's peak is the **device** peak: the CUDA context, the
libraries' kernels and the most the allocator ever *reserves* (``peak_reserved_bytes``), what
nvidia-smi shows. The tensors' own peak, the most ever *allocated* at once
(``peak_allocated_bytes``), comes at another moment: often the allocator goes on reserving
after it (a request that none of its cached blocks can hold gets a new segment), so at the
allocated peak less was reserved (``reserved_at_peak_bytes``) than at the reserved peak. The
device bar splits the device peak exactly: context + libraries + the allocated peak + what
the allocator reserves above the allocated peak (cached blocks and fragmentation). The
breakdown (categories, modules, tensors) is what is live at the allocated peak.

Two more readings of the device peak where they differ from it: the first training step's
peak (a loop's later steps run with the optimizer's state and on the first step's cache; the
headline is the steady state), and total - free as NVML v1 reads it (nvidia-smi's figure plus
the driver's reserve: what schedulers compare with).
"""

from __future__ import annotations

from dataclasses import dataclass

from xmem_engine.estimate import Estimate


def amount(n: int) -> str:
    """Bytes as the headline prints them (``Estimate.headline``): GiB with two decimals."""
    return f"{n / (1 << 30):.2f} GiB"


@dataclass(frozen=True)
class Figure:
    key: str  # stable id, also the report's key
    name: str  # the words every view uses
    bytes: int
    about: str  # one sentence: what it is (tooltips, the report's legend)

    @property
    def text(self) -> str:
        return f"{self.name} {amount(self.bytes)}"


#: the parts of the device bar, in drawing order; their sum is the device peak
DEVICE_SPLIT = ("context", "libraries", "allocated_peak", "reserved_above")


def figures(est: Estimate) -> dict[str, Figure]:
    """Every named quantity of ``est``, in the order views list them."""
    reserved_above = max(0, est.peak_reserved_bytes - est.peak_allocated_bytes)
    out = [
        Figure("device_peak", "peak device memory", est.peak_device_bytes,
               "what nvidia-smi would show at the peak: CUDA context + libraries + the reserved peak"),
        Figure("capacity", "GPU capacity", est.capacity_bytes, "the memory the driver lets a process use"),
        Figure("allocator_limit", "allocator limit", est.allocator_limit_bytes,
               "what PyTorch's allocator may reserve: capacity - CUDA context - libraries"),
        Figure("context", "CUDA context", est.context_bytes, "the CUDA context of the process"),
        Figure("libraries", "libraries", est.outside_allocator_bytes,
               "kernels of PyTorch, cuBLAS and cuDNN, outside PyTorch's allocator"),
        Figure("reserved_peak", "reserved peak", est.peak_reserved_bytes,
               "the most PyTorch's allocator reserves from the GPU during the step"),
        Figure("allocated_peak", "allocated peak", est.peak_allocated_bytes,
               "the most the tensors hold at once"),
        Figure("reserved_above", "reserved above the allocated peak", reserved_above,
               "reserved peak - allocated peak: cached blocks and fragmentation"),
        Figure("allocated_at_reserved_peak", "allocated at the reserved peak", allocated_at_reserved_peak(est),
               "the tensors live while the allocator holds its reserved peak"),
    ]
    first = first_step_peak(est)
    if first is not None:
        out.append(Figure("first_step_peak", "first-step peak", first,
                          "peak device memory before the second training step starts"))
    r = est.readings
    if r.total_minus_free_bytes is not None and r.driver_reserved_bytes is not None:
        out += [Figure("total_minus_free", "total - free", r.total_minus_free_bytes,
                       "the peak as NVML v1 reads it (pynvml's default, many schedulers): peak device memory + "
                       "the driver's reserve"),
                Figure("driver_reserve", "driver reserve", r.driver_reserved_bytes,
                       "memory the driver keeps: total - free counts it, nvidia-smi's used does not")]
    return {f.key: f for f in out}


def allocated_at_reserved_peak(est: Estimate) -> int:
    """The most allocated while reserved memory is at its peak (``Estimate.headline_detail``'s
    figure): the tensors that the reserved peak holds, not the allocated peak's."""
    tl, top = est.timeline, est.peak_reserved_bytes
    return max((a for a, r in zip(tl.allocated, tl.reserved) if r == top), default=est.peak_allocated_bytes)


def first_step_peak(est: Estimate) -> int | None:
    """The first training step's device peak where views show it: at least 1% below the
    steady state's (the headline), else None (one step, or no difference worth a line)."""
    first = est.first_step_peak_device_bytes
    if first is None or est.peak_device_bytes - first < 0.01 * est.peak_device_bytes:
        return None
    return first


#: why later steps peak higher than the first, in every view's words (``Estimate.summary`` too)
STEADY_WHY = "later steps run on what the first left (the optimizer's state, gradients, the allocator's cache)"


def steady_text(est: Estimate) -> str | None:
    """The first step's peak beside the steady state's, or None where they do not differ."""
    f = figures(est)
    if "first_step_peak" not in f:
        return None
    return (f"{f['first_step_peak'].text}; {f['device_peak'].text} over {est.steps} steps, the steady state: "
            f"{STEADY_WHY}")


def readings_text(est: Estimate) -> str:
    """The peak as nvidia-smi reads it and as total - free (NVML v1, what schedulers see) does."""
    f = figures(est)
    if "total_minus_free" not in f:
        return (f"{f['device_peak'].text} as nvidia-smi reads it; total - free (NVML v1 used) not known: no driver "
                "reserve is known for this GPU")
    rng = est.readings.total_minus_free_range
    within = f" (range {amount(rng[0])} - {amount(rng[1])})" if rng else ""
    return (f"{f['total_minus_free'].text}{within} as NVML v1 reads it (pynvml's default, many schedulers) = "
            f"{f['device_peak'].text} as nvidia-smi reads it + {f['driver_reserve'].text}")


def device_split(est: Estimate) -> list[Figure]:
    """The device bar's parts: context, libraries, allocated peak, reserved above it."""
    f = figures(est)
    return [f[k] for k in DEVICE_SPLIT]


def peak_events(est: Estimate) -> tuple[int | None, int | None]:
    """The timeline events where allocated memory peaks and where reserved memory first
    reaches its peak (None without a timeline)."""
    tl = est.timeline
    if not tl.event:
        return None, None
    a = max(range(len(tl.allocated)), key=tl.allocated.__getitem__)
    r = max(range(len(tl.reserved)), key=tl.reserved.__getitem__)
    return tl.event[a], tl.event[r]


def split_text(est: Estimate) -> str:
    """The device peak in words, its parts named as the bar names them."""
    f = figures(est)
    text = (f"{f['device_peak'].text} = {f['context'].text} + {f['libraries'].text} + "
            f"{f['reserved_peak'].text} ({f['allocated_peak'].text} + {f['reserved_above'].text}: cached blocks "
            "and fragmentation)")
    at_alloc, at_res = peak_events(est)
    if at_alloc is not None and at_res is not None and at_alloc != at_res:
        text += (f"; the allocated peak comes at event {at_alloc:,}, the reserved peak at event {at_res:,}")
    return text


def report_figures(est: Estimate) -> dict:
    """The figures as the saved report carries them (``figures``): key -> name, bytes, about;
    ``split`` lists the device bar's parts, ``text`` is :func:`split_text`, ``readings``
    :func:`readings_text` and ``steady`` :func:`steady_text` ("" for one step)."""
    f = figures(est)
    return {"items": {k: {"name": v.name, "bytes": v.bytes, "about": v.about} for k, v in f.items()},
            "split": list(DEVICE_SPLIT), "text": split_text(est),
            "readings": readings_text(est), "steady": steady_text(est) or ""}


def chart_text(est: Estimate, flame=None) -> str:
    """The charts in words (their text alternative): what they show and their marks' figures."""
    f = figures(est)
    at_alloc, at_res = peak_events(est)
    where = lambda e: f" at event {e:,}" if e is not None else ""  # noqa: E731
    n = f" of {flame.n_tensors:,} tensors" if flame is not None else ""
    text = (f"Charts: tensor lifetimes{n} (a flame chart, coloured by category) above the allocator's memory "
            f"over the step. {f['allocated_peak'].text}{where(at_alloc)}; {f['reserved_peak'].text}{where(at_res)}; "
            f"{f['capacity'].text}; {f['allocator_limit'].text}")
    if est.oom and est.oom_event is not None:
        text += f"; the run on this GPU runs out of memory at event {est.oom_event:,}"
    if len(est.timeline.iterations) >= 2:
        text += f"; step 2 of {est.steps} starts at event {est.timeline.iterations[1]:,} (dotted lines: each step)"
    return text + "."
