"""Everything the recorder asks of the device, behind one interface.

`CudaProbe` talks to a real GPU (torch.cuda, plus NVML or nvidia-smi for the
numbers torch cannot give before CUDA initialises).  `DryRunProbe` answers the
same questions on the CPU so the whole recording pipeline can be exercised
without a GPU: its "device" is this process's resident memory, and its memory
history comes from a dispatch-mode tracer that writes events in the same shape
as torch.cuda.memory._snapshot().
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ContextManager

import torch

from benchmarks._nvml import Nvml, nvidia_smi

MEMORY_STAT_KEYS = (
    "num_alloc_retries",
    "num_ooms",
    "num_device_alloc",
    "num_device_free",
    "num_sync_all_streams",
    "allocated_bytes.all.peak",
    "reserved_bytes.all.peak",
    "active_bytes.all.peak",
    "requested_bytes.all.peak",
)


@dataclass
class Reading:
    """A memory figure and where it came from (sources differ in what they count)."""

    value: int | None
    source: str | None


# ----------------------------------------------------------------------- probes
class Probe(ABC):
    """What the recorder needs from a device; one implementation per kind of device."""

    dry_run: bool
    sampler_source: str

    @abstractmethod
    def used_before_init(self) -> Reading:
        """Device memory in use before this process initialises the device."""

    @abstractmethod
    def init_device(self) -> tuple[int, int]:
        """Initialise the device (CUDA context); return (used, total) right after."""

    @abstractmethod
    def device_used(self) -> int:
        """Device memory in use now, from `sampler_source`; called from the sampler thread."""

    @abstractmethod
    def mem_get_info_used(self) -> int:
        """total - free as torch.cuda.mem_get_info reports it (or the dry-run stand-in)."""

    @abstractmethod
    def environment(self) -> dict[str, Any]:
        """GPU name, driver, torch / CUDA / cuDNN versions."""

    @abstractmethod
    def start_history(self, max_entries: int) -> None:
        """Start recording the allocator's event history."""

    def workload_context(self) -> ContextManager:
        """Context the workload runs inside (the dry run's tracer needs one)."""
        return contextlib.nullcontext()

    @abstractmethod
    def synchronize(self) -> None:
        """Wait for queued device work, so frees and peaks are final."""

    @abstractmethod
    def allocator_stats(self) -> dict[str, Any]:
        """max_memory_allocated, max_memory_reserved and selected memory_stats counters."""

    @abstractmethod
    def snapshot(self) -> dict[str, Any]:
        """The allocator snapshot, in torch.cuda.memory._snapshot() format."""

    @abstractmethod
    def stop_history(self) -> None:
        """Stop recording history."""


class CudaProbe(Probe):
    """The real thing: torch.cuda on device 0, NVML if importable, else nvidia-smi."""

    dry_run = False

    def __init__(self) -> None:
        self._nvml = Nvml.open()
        self.sampler_source = "nvml" if self._nvml else "mem_get_info"

    def used_before_init(self) -> Reading:
        if self._nvml is not None:
            try:
                return Reading(self._nvml.used(), "nvml")
            except Exception:
                pass
        mib = nvidia_smi("memory.used")
        if mib is not None and mib.isdigit():
            return Reading(int(mib) * 2**20, "nvidia-smi")
        return Reading(None, None)

    def init_device(self) -> tuple[int, int]:
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA is not available in this process; use --dry-run on a machine without a GPU")
        torch.cuda.set_device(0)
        free, total = torch.cuda.mem_get_info(0)  # creates the primary context
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.select(str(torch.cuda.get_device_properties(0).uuid))
        return total - free, total

    def device_used(self) -> int:
        if self._nvml is not None:
            return self._nvml.used()
        return self.mem_get_info_used()

    def mem_get_info_used(self) -> int:
        free, total = torch.cuda.mem_get_info(0)
        return total - free

    def environment(self) -> dict[str, Any]:
        props = torch.cuda.get_device_properties(0)
        driver = None
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                driver = self._nvml.driver_version()
        driver = driver or nvidia_smi("driver_version")
        return {
            "gpu_name": torch.cuda.get_device_name(0),
            "gpu_uuid": str(getattr(props, "uuid", "")) or None,
            "gpu_total_memory": int(props.total_memory),
            "compute_capability": f"{props.major}.{props.minor}",
            "driver_version": driver,
            "torch_version": torch.__version__,
            "cuda_version": torch.version.cuda,
            "cudnn_version": torch.backends.cudnn.version(),
            "python_version": sys.version.split()[0],
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        }

    def start_history(self, max_entries: int) -> None:
        torch.cuda.reset_peak_memory_stats(0)
        torch.cuda.memory._record_memory_history("all", context="all", stacks="python", max_entries=max_entries)

    def synchronize(self) -> None:
        torch.cuda.synchronize(0)

    def allocator_stats(self) -> dict[str, Any]:
        stats = torch.cuda.memory_stats(0)
        return {
            "max_memory_allocated": int(torch.cuda.max_memory_allocated(0)),
            "max_memory_reserved": int(torch.cuda.max_memory_reserved(0)),
            "memory_allocated_end": int(torch.cuda.memory_allocated(0)),
            "memory_reserved_end": int(torch.cuda.memory_reserved(0)),
            "memory_stats": {k: int(stats.get(k, 0)) for k in MEMORY_STAT_KEYS},
        }

    def snapshot(self) -> dict[str, Any]:
        return torch.cuda.memory._snapshot()

    def stop_history(self) -> None:
        torch.cuda.memory._record_memory_history(None)


# ------------------------------------------------------------------ dry run
def _rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; ru_maxrss elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _python_frames(limit: int = 48) -> list[dict[str, Any]]:
    """Python stack, innermost first, shaped like snapshot frames."""
    frames, f = [], sys._getframe(2)
    while f is not None and len(frames) < limit:
        frames.append({"filename": f.f_code.co_filename, "line": f.f_lineno, "name": f.f_code.co_name})
        f = f.f_back
    return frames


class _CpuAllocationTracer:
    """Records tensor storages created by ops as caching-allocator-style events.

    One 'alloc' per new storage (sized by its bytes) and 'free_requested' /
    'free_completed' when the storage is really freed (storage Python objects
    are preserved by torch, so a finalizer fires on the real free).  There is
    no caching, so "reserved" equals "allocated"; good enough to exercise the
    pipeline, not a memory model.
    """

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.events: list[dict[str, Any]] = []
        self.live: dict[int, tuple[int, list[dict[str, Any]]]] = {}
        self.current = self.peak = self.n_alloc = self.n_free = 0
        self.lock = threading.RLock()  # finalizers may fire while we hold it

    def _event(self, action: str, addr: int, size: int, frames: list[dict[str, Any]]) -> None:
        self.events.append({"action": action, "addr": addr, "size": size, "stream": 0,
                            "time_us": time.time_ns() // 1000, "frames": frames})
        if len(self.events) > self.max_entries:
            del self.events[0]

    def on_output(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        addr, size = storage.data_ptr(), storage.nbytes()
        if size == 0 or t.device.type != "cpu":
            return
        with self.lock:
            if addr in self.live:
                return
            frames = _python_frames()
            self.live[addr] = (size, frames)
            self.current += size
            self.peak = max(self.peak, self.current)
            self.n_alloc += 1
            self._event("alloc", addr, size, frames)
        weakref.finalize(storage, self.on_free, addr)

    def on_free(self, addr: int) -> None:
        with self.lock:
            entry = self.live.pop(addr, None)
            if entry is None:
                return
            self.current -= entry[0]
            self.n_free += 1
            frames = _python_frames()
            self._event("free_requested", addr, entry[0], frames)
            self._event("free_completed", addr, entry[0], frames)

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            segments = [
                {"device": 0, "address": addr, "total_size": size, "allocated_size": size,
                 "active_size": size, "requested_size": size, "stream": 0,
                 "segment_type": "large" if size > 2**20 else "small", "segment_pool_id": (0, 0),
                 "is_expandable": False, "frames": [],
                 "blocks": [{"address": addr, "size": size, "requested_size": size,
                             "state": "active_allocated", "frames": frames}]}
                for addr, (size, frames) in sorted(self.live.items())
            ]
            return {"segments": segments, "device_traces": [list(self.events)]}


def _tracer_mode(tracer: _CpuAllocationTracer) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    def dispatch(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                tracer.on_output(leaf)
        return out

    # torch wraps __torch_dispatch__ in a lazy dynamo-disable whose first call imports
    # torch._dynamo (seconds per process); nothing is compiled here, so pre-answer it.
    setattr(dispatch, "__dynamo_disable", dispatch)
    return type("_AllocationTracerMode", (TorchDispatchMode,), {"__torch_dispatch__": dispatch})()


class DryRunProbe(Probe):
    """CPU stand-in: RSS for device memory, a dispatch-mode tracer for the allocator history."""

    dry_run = True
    sampler_source = "rss"

    def __init__(self) -> None:
        self._tracer: _CpuAllocationTracer | None = None

    def used_before_init(self) -> Reading:
        return Reading(_rss_bytes(), "rss")

    def init_device(self) -> tuple[int, int]:
        return _rss_bytes(), os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def device_used(self) -> int:
        return _rss_bytes()

    def mem_get_info_used(self) -> int:
        return _rss_bytes()

    def environment(self) -> dict[str, Any]:
        return {
            "gpu_name": "cpu-dry-run",
            "gpu_uuid": None,
            "gpu_total_memory": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "compute_capability": None,
            "driver_version": None,
            "torch_version": torch.__version__,
            "cuda_version": torch.version.cuda,
            "cudnn_version": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
            "python_version": sys.version.split()[0],
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        }

    def start_history(self, max_entries: int) -> None:
        self._tracer = _CpuAllocationTracer(max_entries)

    def workload_context(self) -> ContextManager:
        if self._tracer is None:
            return contextlib.nullcontext()
        return _tracer_mode(self._tracer)

    def synchronize(self) -> None:
        pass

    def allocator_stats(self) -> dict[str, Any]:
        t = self._tracer or _CpuAllocationTracer(0)
        return {
            "max_memory_allocated": t.peak,
            "max_memory_reserved": t.peak,
            "memory_allocated_end": t.current,
            "memory_reserved_end": t.current,
            "memory_stats": {**{k: 0 for k in MEMORY_STAT_KEYS}, "num_device_alloc": t.n_alloc,
                             "num_device_free": t.n_free, "allocated_bytes.all.peak": t.peak,
                             "reserved_bytes.all.peak": t.peak},
        }

    def snapshot(self) -> dict[str, Any]:
        return self._tracer.snapshot() if self._tracer else {"segments": [], "device_traces": [[]]}

    def stop_history(self) -> None:
        self._tracer = None


class MemorySampler:
    """Background thread polling the probe's device-used figure to catch the run's peak."""

    def __init__(self, probe: Probe, interval_s: float = 0.005) -> None:
        self.probe, self.interval_s = probe, interval_s
        self.peak, self.samples, self.errors = 0, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="memory-sampler", daemon=True)

    def sample(self) -> None:
        try:
            self.peak = max(self.peak, self.probe.device_used())
            self.samples += 1
        except Exception:
            self.errors += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> "MemorySampler":
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sample()
