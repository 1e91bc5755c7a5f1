"""A virtual CUDA device: the ``torch.cuda`` API answered without a GPU.

While the tracer runs user code, :func:`patched_cuda` replaces the ``torch.cuda`` functions
that code calls (``is_available``, device properties, streams, events, memory statistics,
``empty_cache`` ...) with answers about the *target* GPU: memory statistics (and the
``torch.cuda.memory._snapshot`` / ``_dump_snapshot`` pair) come from the simulated caching
allocator, device properties from a description of the target GPU. The
tensors themselves live on the CPU; the tracer's TorchFunctionMode makes them report
``cuda:0`` (see ``tracer.py``). Every patched attribute is restored when the context exits,
also on error or KeyboardInterrupt.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

if TYPE_CHECKING:  # pragma: no cover
    from xmem_engine.tracer import Tracer

DEFAULT_DEVICE: dict[str, Any] = {
    "name": "NVIDIA A100-SXM4-40GB",
    "total_memory": 42_505_273_344,
    "major": 8,
    "minor": 0,
    "multi_processor_count": 108,
}


@dataclass(frozen=True)
class DeviceProperties:
    """What ``torch.cuda.get_device_properties`` reports for the target GPU."""

    name: str
    total_memory: int
    major: int
    minor: int
    multi_processor_count: int
    is_integrated: bool = False
    is_multi_gpu_board: bool = False
    L2_cache_size: int = 41_943_040
    warp_size: int = 32
    gcnArchName: str = "NVIDIA CUDA"

    @classmethod
    def from_dict(cls, device: dict | None) -> "DeviceProperties":
        d = dict(DEFAULT_DEVICE)
        if device:  # other keys (a catalog's extra fields) are not device properties
            d.update({k: v for k, v in device.items() if k in cls.__dataclass_fields__})
        return cls(**d)

    def __repr__(self) -> str:  # the format torch prints
        return (
            f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // (1024 * 1024)}MB, "
            f"multi_processor_count={self.multi_processor_count})"
        )


class VirtualStream:
    """Stands in for ``torch.cuda.Stream``: only its identity matters (a simulator stream)."""

    _next_id = 1

    def __init__(self, device: Any = None, priority: int = 0, *, stream_id: int | None = None, **_: Any):
        if stream_id is None:
            stream_id = VirtualStream._next_id
            VirtualStream._next_id += 1
        self.stream_id = stream_id
        self.priority = priority
        self.device = torch.device("cuda", 0)

    cuda_stream = property(lambda self: self.stream_id)

    def wait_stream(self, stream: "VirtualStream") -> None:
        pass

    def wait_event(self, event: "VirtualEvent") -> None:
        pass

    def record_event(self, event: "VirtualEvent | None" = None) -> "VirtualEvent":
        return event or VirtualEvent()

    def synchronize(self) -> None:
        pass

    def is_capturing(self) -> bool:
        """CUDA graph capture never runs on the virtual device (optimizers ask)."""
        return False

    def query(self) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VirtualStream) and other.stream_id == self.stream_id

    def __hash__(self) -> int:
        return hash(("xmem-stream", self.stream_id))

    def __repr__(self) -> str:
        return f"<torch.cuda.Stream device=cuda:0 cuda_stream={self.stream_id}>"


class VirtualEvent:
    """Stands in for ``torch.cuda.Event``; no clock, so elapsed times are 0."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing

    def record(self, stream: VirtualStream | None = None) -> None:
        pass

    def wait(self, stream: VirtualStream | None = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end_event: "VirtualEvent") -> float:
        return 0.0


class _StreamContext:
    """``torch.cuda.stream(s)``: allocations inside go to stream ``s``."""

    def __init__(self, vc: "VirtualCuda", stream: VirtualStream | None):
        self.vc, self.stream, self.prev = vc, stream, None

    def __enter__(self) -> VirtualStream | None:
        if self.stream is not None:
            self.prev = self.vc.current_stream
            self.vc.current_stream = self.stream
        return self.stream

    def __exit__(self, *exc: object) -> None:
        if self.stream is not None:
            self.vc.current_stream = self.prev


class VirtualCuda:
    """The state of the virtual device: target properties, streams, and the tracer to ask."""

    def __init__(self, tracer: "Tracer", device: dict | None = None):
        self.tracer = tracer
        self.props = DeviceProperties.from_dict(device)
        self.default_stream = VirtualStream(stream_id=0)
        self.current_stream = self.default_stream
        self.memory_fraction = 1.0

    # ------------------------------------------------------------ the patched API
    def functions(self) -> dict[str, Callable[..., Any]]:
        """Name -> replacement for ``torch.cuda.<name>`` (and ``torch.cuda.memory.<name>``)."""
        t = self.tracer
        p = self.props

        def _stats_device(device: Any = None) -> None:
            if device is not None and _device_index(device) != 0:
                raise RuntimeError(f"Invalid device argument {device}: the virtual GPU has one device")

        def memory_allocated(device: Any = None) -> int:
            _stats_device(device)
            return t.allocator.memory_allocated()

        def max_memory_allocated(device: Any = None) -> int:
            _stats_device(device)
            return t.allocator.max_memory_allocated()

        def memory_reserved(device: Any = None) -> int:
            _stats_device(device)
            return t.allocator.memory_reserved()

        def max_memory_reserved(device: Any = None) -> int:
            _stats_device(device)
            return t.allocator.max_memory_reserved()

        def memory_stats(device: Any = None) -> dict[str, int]:
            _stats_device(device)
            return dict(t.allocator.memory_stats())

        def reset_peak_memory_stats(device: Any = None) -> None:
            t.reset_peak()

        def reset_accumulated_memory_stats(device: Any = None) -> None:
            reset = getattr(t.allocator, "reset_accumulated_stats", None)
            if reset is not None:
                reset()

        def mem_get_info(device: Any = None) -> tuple[int, int]:
            return (max(p.total_memory - t.allocator.memory_reserved(), 0), p.total_memory)

        def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
            mib = 1024 * 1024
            a = t.allocator
            return (
                f"xmem virtual {p.name}: allocated {a.memory_allocated() / mib:.1f} MiB "
                f"(peak {a.max_memory_allocated() / mib:.1f} MiB), reserved "
                f"{a.memory_reserved() / mib:.1f} MiB (peak {a.max_memory_reserved() / mib:.1f} MiB)"
            )

        def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
            self.memory_fraction = fraction
            setf = getattr(t.allocator, "set_memory_fraction", None)
            if setf is not None and getattr(t.allocator, "device_total", None):
                setf(fraction)

        def synchronize(device: Any = None) -> None:
            sync = getattr(t.allocator, "synchronize", None)
            if sync is not None:
                sync()

        def record_memory_history(enabled: Any = "all", *args: Any, **kwargs: Any) -> None:
            if not hasattr(t.allocator, "history"):
                return
            if enabled in (None, False):
                t.allocator.history = None
            elif t.allocator.history is None:
                t.allocator.history = []

        def snapshot(device: Any = None) -> dict:
            from xmem_engine.snapshot import make_snapshot

            return make_snapshot(t.allocator, device_trace=getattr(t.allocator, "history", None))

        def dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
            from xmem_engine.snapshot import dump_snapshot as dump

            dump(snapshot(), filename)

        def stream(s: VirtualStream | None) -> _StreamContext:
            return _StreamContext(self, s)

        def set_stream(s: VirtualStream) -> None:
            self.current_stream = s

        return {
            "is_available": lambda: True,
            "is_initialized": lambda: True,
            "init": lambda: None,
            "_lazy_init": lambda: None,
            "device_count": lambda: 1,
            "current_device": lambda: 0,
            "set_device": lambda device: None,
            "get_device_name": lambda device=None: p.name,
            "get_device_capability": lambda device=None: (p.major, p.minor),
            "get_device_properties": lambda device=None: p,
            "get_arch_list": lambda: [f"sm_{p.major}{p.minor}"],
            "is_bf16_supported": lambda including_emulation=True: p.major >= 8,
            "is_current_stream_capturing": lambda: False,
            "synchronize": synchronize,
            "empty_cache": t.empty_cache,
            "memory_allocated": memory_allocated,
            "max_memory_allocated": max_memory_allocated,
            "memory_reserved": memory_reserved,
            "max_memory_reserved": max_memory_reserved,
            "memory_stats": memory_stats,
            "reset_peak_memory_stats": reset_peak_memory_stats,
            "reset_max_memory_allocated": reset_peak_memory_stats,
            "reset_accumulated_memory_stats": reset_accumulated_memory_stats,
            "mem_get_info": mem_get_info,
            "_record_memory_history": record_memory_history,
            "_snapshot": snapshot,
            "_dump_snapshot": dump_snapshot,
            "memory_summary": memory_summary,
            "set_per_process_memory_fraction": set_per_process_memory_fraction,
            "get_rng_state": lambda device="cuda": torch.zeros(16, dtype=torch.uint8),
            "get_rng_state_all": lambda: [torch.zeros(16, dtype=torch.uint8)],
            "set_rng_state": lambda new_state, device="cuda": None,
            "set_rng_state_all": lambda new_states: None,
            "manual_seed": lambda seed: None,
            "manual_seed_all": lambda seed: None,
            "seed": lambda: None,
            "seed_all": lambda: None,
            "Stream": VirtualStream,
            "Event": VirtualEvent,
            "stream": stream,
            "set_stream": set_stream,
            "current_stream": lambda device=None: self.current_stream,
            "default_stream": lambda device=None: self.default_stream,
            "device": _DeviceContext,
        }


class _DeviceContext(contextlib.nullcontext):
    """``torch.cuda.device(i)``: one virtual device, so selecting it changes nothing."""

    def __init__(self, device: Any = None):
        super().__init__()
        self.idx = _device_index(device)


def _device_index(device: Any) -> int:
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    d = torch.device(device) if isinstance(device, str) else device
    return d.index or 0 if isinstance(d, torch.device) else 0


class _CudaAutocast(torch.amp.autocast_mode.autocast):
    """``torch.autocast("cuda", ...)`` on the virtual device: the tensors are CPU tensors, so
    the region casts with CPU autocast at the same dtype (float16 by default, as on CUDA).

    CPU autocast lowers the same matmul / convolution / linear ops as CUDA does; it keeps a
    few ops that CUDA runs in float32 (softmax, layer_norm) in the lower precision, which can
    make their outputs half the size they would be on the GPU.
    """

    def __init__(self, device_type: str = "cuda", dtype: torch.dtype | None = None, enabled: bool = True,
                 cache_enabled: bool | None = None):
        if device_type == "cuda":
            device_type, dtype = "cpu", dtype or torch.float16
        super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class _CudaAmpAutocast(_CudaAutocast):
    """``torch.cuda.amp.autocast(enabled, dtype, cache_enabled)`` (the deprecated spelling)."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True):
        super().__init__("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


@contextlib.contextmanager
def patched_cuda(vc: VirtualCuda) -> Iterator[VirtualCuda]:
    """Install the virtual device's ``torch.cuda`` functions; restore the originals after."""
    import torch.cuda.memory as cuda_memory
    import torch.cuda.nvtx as nvtx

    def patch(mod: Any, name: str, fn: Any) -> None:
        had = name in vars(mod)
        saved.append((mod, name, vars(mod).get(name), had))
        setattr(mod, name, fn)

    saved: list[tuple[Any, str, Any, bool]] = []
    try:
        for name, fn in vc.functions().items():
            patch(torch.cuda, name, fn)
            if hasattr(cuda_memory, name):
                patch(cuda_memory, name, fn)
        # torch.accelerator (2.6+) is the device-generic front of the same calls; on a CUDA
        # build without a GPU it would ask the driver, so it answers for the virtual GPU too.
        accelerator = getattr(torch, "accelerator", None)
        if accelerator is not None:
            fns = vc.functions()
            generic = {
                "is_available": lambda *a, **k: True,
                "device_count": lambda *a, **k: 1,
                "current_accelerator": lambda *a, **k: torch.device("cuda"),
                "current_device_index": lambda *a, **k: 0,
                "current_device_idx": lambda *a, **k: 0,
                "set_device_index": lambda *a, **k: None,
                "set_device_idx": lambda *a, **k: None,
                "current_stream": lambda *a, **k: vc.current_stream,
                "get_device_capability": lambda *a, **k: (vc.props.major, vc.props.minor),
            }
            for name in ("synchronize", "empty_cache", "memory_allocated", "max_memory_allocated",
                         "memory_reserved", "max_memory_reserved", "memory_stats", "reset_peak_memory_stats",
                         "reset_accumulated_memory_stats", "set_stream"):
                if name in fns:
                    generic[name] = fns[name]
            for name, fn in generic.items():
                if hasattr(accelerator, name):
                    patch(accelerator, name, fn)
        # Autocast regions for "cuda" become CPU autocast regions of the same dtype.
        import torch.cuda.amp as cuda_amp

        patch(torch, "autocast", _CudaAutocast)
        patch(torch.amp, "autocast", _CudaAutocast)
        patch(cuda_amp, "autocast", _CudaAmpAutocast)
        # NVTX annotations are profiler markers: nothing to do without a GPU profiler.
        for name in ("range_push", "range_pop", "range_start", "range_end", "mark"):
            patch(nvtx, name, lambda *args, **kwargs: 0)
        patch(nvtx, "range", lambda *args, **kwargs: contextlib.nullcontext())
        yield vc
    finally:
        for mod, name, old, had in reversed(saved):
            if had:
                setattr(mod, name, old)
            else:
                with contextlib.suppress(AttributeError):
                    delattr(mod, name)
