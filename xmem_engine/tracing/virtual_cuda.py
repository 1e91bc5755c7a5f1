"""A virtual CUDA device: the ``torch.cuda`` API answered without a GPU.

While the tracer runs user code, :func:`patched_cuda` replaces the ``torch.cuda`` functions
that code calls (``is_available``, device properties, streams, events, memory statistics,
``empty_cache`` ...) with answers about the *target* GPU: memory statistics (and the
``torch.cuda.memory._snapshot`` / ``_dump_snapshot`` pair) come from the simulated caching
allocator, device properties from a description of the target GPU. The
tensors themselves live on the CPU; the tracer's TorchFunctionMode makes them report
``cuda:0`` (``device_mode.py``). ``autocast("cuda")`` regions cast with CUDA's per-op lists
(``autocast_policy.py``, entered through :func:`autocast_methods`), and ``GradScaler``'s
value reads take the step in fake mode (:func:`_grad_scaler_methods`). Every patched attribute
and dispatcher registration is undone when the context exits, also on error or
KeyboardInterrupt.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol

import torch

# (first: it takes torch.accelerator's answers before this module patches them)
from xmem_engine.tracing.cuda_graphs import VirtualCudaGraphs
from xmem_engine.tracing.compiler import inductor_gpu  # noqa: F401
from xmem_engine.tracing.kernels.autocast_policy import CudaAutocastPolicy
from xmem_engine.tracing.patches import patched_attr
from xmem_engine.trace import RESET_PEAK, SYNCHRONIZE
from xmem_engine.tracing.fake.placeholders import FakeFloat, FakeInt


class Recorder(Protocol):
    """What the virtual device asks of the tracer (``tracer.Tracer`` is one)."""

    allocator: Any  # the simulated caching allocator that answers torch.cuda.memory_*

    def is_gpu(self, t: torch.Tensor) -> bool: ...

    def empty_cache(self) -> None: ...

    def mark(self, kind: str) -> None: ...

DEFAULT_DEVICE: dict[str, Any] = {
    "name": "NVIDIA A100-SXM4-40GB",
    "total_memory": 42_505_273_344,
    "major": 8,
    "minor": 0,
    "multi_processor_count": 108,
    "context_bytes": 446_693_376,  # the catalog's A100-SXM4-40GB
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
    uuid: str = "00000000-0000-0000-0000-000000000000"  # (a virtual GPU has no serial)

    @classmethod
    def from_dict(cls, device: dict | None) -> "DeviceProperties":
        d = dict(DEFAULT_DEVICE)
        if device:
            d.update(device)
        # other keys (the context, a catalog's extra fields) are not device properties
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

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
        torch.cuda.synchronize()  # the virtual device's: every stream is taken to have caught up

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

    def __enter__(self) -> "VirtualStream":
        """``with stream:`` (``torch.Stream``, 2.7+): the current stream for the block. Only
        made while tracing, when ``torch.cuda``'s stream functions are the virtual device's."""
        self.__dict__.setdefault("_outer", []).append(torch.cuda.current_stream())
        torch.cuda.set_stream(self)
        return self

    def __exit__(self, *exc: object) -> None:
        torch.cuda.set_stream(self._outer.pop())


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
        torch.cuda.synchronize()  # (FSDP's rate limiter waits on one each unshard)

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

    def __init__(self, tracer: Recorder, device: dict | None = None, index: int = 0, count: int = 1):
        self.tracer = tracer
        # The node's GPUs as the code sees them (``device_count``), and the one traced: a
        # distributed rank's (its LOCAL_RANK), where all of its storages go.
        self.index, self.count = index, count
        self.device = torch.device("cuda", index)
        self.props = DeviceProperties.from_dict(device)
        # The CUDA context the process holds on the target GPU: mem_get_info's "free" leaves it out.
        self.context_bytes = int((device or DEFAULT_DEVICE).get("context_bytes", DEFAULT_DEVICE["context_bytes"]))
        self.device_dict = dict(device or DEFAULT_DEVICE)  # as given, for what is not a property
        self.default_stream = VirtualStream(stream_id=0)
        self.current_stream = self.default_stream
        self.memory_fraction = 1.0
        self.seed = 67280421310721  # CUDA's default generator's seed (default_rng_seed_val) until seeded
        # CUDA's autocast lists for the tensors on the virtual GPU (see autocast_methods)
        self.autocast = CudaAutocastPolicy(on_device=tracer.is_gpu)
        self.autocast_depth = 0
        self.graphs = VirtualCudaGraphs(self)  # the code's own CUDA graphs and memory pools

    def on_stream(self, stream: VirtualStream | None) -> "_StreamContext":
        """``torch.cuda.stream(stream)``: the block's allocations go to ``stream`` (None: unchanged)."""
        return _StreamContext(self, stream)

    # ------------------------------------------------------------ the patched API
    def functions(self) -> dict[str, Callable[..., Any]]:
        """Name -> replacement for ``torch.cuda.<name>`` (and ``torch.cuda.memory.<name>``)."""
        t = self.tracer
        p = self.props

        def _stats_device(device: Any = None) -> None:
            if device is not None and _device_index(device, self.index) != self.index:
                raise RuntimeError(f"Invalid device argument {device}: xmem traces the GPU of one process, "
                                   f"cuda:{self.index}")

        def set_device(device: Any) -> None:
            i = _device_index(device, self.index)
            if not 0 <= i < self.count:
                raise RuntimeError(f"CUDA error: invalid device ordinal (cuda:{i}; the virtual node has "
                                   f"{self.count} GPU{'s' if self.count != 1 else ''}: --world-size / --gpus-per-node)")

        def read(what: str, value: int) -> int:  # with the batch a symbol, the traced size's (symbolic.py)
            return value if t.symbolic is None else t.symbolic.reading(f"torch.cuda.{what}()", value)

        def memory_allocated(device: Any = None) -> int:
            _stats_device(device)
            return read("memory_allocated", t.allocator.memory_allocated())

        def max_memory_allocated(device: Any = None) -> int:
            _stats_device(device)
            return read("max_memory_allocated", t.allocator.max_memory_allocated())

        def memory_reserved(device: Any = None) -> int:
            _stats_device(device)
            return read("memory_reserved", t.allocator.memory_reserved())

        def max_memory_reserved(device: Any = None) -> int:
            _stats_device(device)
            return read("max_memory_reserved", t.allocator.max_memory_reserved())

        def memory_stats(device: Any = None) -> dict[str, int]:
            _stats_device(device)
            return dict(t.allocator.memory_stats())

        def reset_peak_memory_stats(device: Any = None) -> None:
            t.mark(RESET_PEAK)

        def reset_accumulated_memory_stats(device: Any = None) -> None:
            reset = getattr(t.allocator, "reset_accumulated_stats", None)
            if reset is not None:
                reset()

        def mem_get_info(device: Any = None) -> tuple[int, int]:
            """(free, total) as the driver reports them: the context and what the allocator
            holds are not free."""
            used = self.context_bytes + t.allocator.memory_reserved()
            return (read("mem_get_info", max(p.total_memory - used, 0)), p.total_memory)

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
            t.mark(SYNCHRONIZE)  # deferred frees (record_stream) complete

        def record_memory_history(enabled: Any = "all", *args: Any, **kwargs: Any) -> None:
            if not hasattr(t.allocator, "history"):
                return
            if enabled in (None, False):
                t.allocator.history = None
            elif t.allocator.history is None:
                t.allocator.history = []

        def snapshot(device: Any = None) -> dict:
            from xmem_engine.simulation.snapshot import make_snapshot

            return make_snapshot(t.allocator, device_trace=getattr(t.allocator, "history", None))

        def dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
            from xmem_engine.simulation.snapshot import dump_snapshot as dump

            dump(snapshot(), filename)

        # (parameter names as torch's: timm's prefetcher calls torch.cuda.stream(stream=s))
        def stream(stream: VirtualStream | None) -> _StreamContext:
            return self.on_stream(stream)

        def set_stream(stream: VirtualStream) -> None:
            self.current_stream = stream

        return {
            "is_available": lambda: True,
            "is_initialized": lambda: True,
            "init": lambda: None,
            "_lazy_init": lambda: None,
            "device_count": lambda: self.count,
            "current_device": lambda: self.index,
            "set_device": set_device,
            "get_device_name": lambda device=None: p.name,
            "get_device_capability": lambda device=None: (p.major, p.minor),
            "get_device_properties": lambda device=None: p,
            "get_arch_list": lambda: [f"sm_{p.major}{p.minor}"],
            # as torch answers: sm_80+ in hardware; below, emulated (a bf16 tensor can be made on
            # any CUDA GPU, so on a T4 autocast to bf16 runs, and HF's bf16=True is accepted)
            "is_bf16_supported": lambda including_emulation=True: p.major >= 8 or bool(including_emulation),
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
            "manual_seed": lambda seed: setattr(self, "seed", int(seed)),
            "manual_seed_all": lambda seed: setattr(self, "seed", int(seed)),
            "seed": lambda: None,
            "seed_all": lambda: None,
            "initial_seed": lambda: self.seed,
            "get_per_process_memory_fraction": lambda device=None: self.memory_fraction,
            "memory_snapshot": lambda mempool_id=None: snapshot()["segments"],
            # NVML's readings (pynvml on a GPU machine): used memory as the driver counts it
            # (the context and what the allocator holds); activity, heat and power none
            "device_memory_used": lambda device=None: self.context_bytes + t.allocator.memory_reserved(),
            "get_allocator_backend": lambda: "native",
            "get_sync_debug_mode": lambda: 0,
            "set_sync_debug_mode": lambda debug_mode: None,
            "ipc_collect": lambda: None,
            "can_device_access_peer": lambda device, peer_device: _device_index(device) != _device_index(peer_device),
            "utilization": lambda device=None: 0,
            "memory_usage": lambda device=None: 0,
            "temperature": lambda device=None: 0,
            "power_draw": lambda device=None: 0,
            "clock_rate": lambda device=None: 0,
            "Stream": VirtualStream,
            "Event": VirtualEvent,
            "stream": stream,
            "set_stream": set_stream,
            "current_stream": lambda device=None: self.current_stream,
            "default_stream": lambda device=None: self.default_stream,
            "device": _DeviceContext,
            **self.graphs.functions(),
        }


def _per_device(real: type, on_gpu: Callable[..., Any], default: Any = None, *virtual: type) -> type:
    """``torch.Stream`` / ``torch.Event`` / ``torch.Generator`` while tracing: made by ``on_gpu``
    where they name the GPU (an index, ``"cuda"``, or no device: the current accelerator), by
    torch for any other device; ``isinstance`` holds for both kinds."""
    kinds = (real, *virtual)

    class PerDevice(type):
        def __call__(cls, device: Any = default, *args: Any, **kwargs: Any) -> Any:
            gpu = device is None or isinstance(device, int) or torch.device(device).type == "cuda"
            return on_gpu(device, *args, **kwargs) if gpu else real(device, *args, **kwargs)

        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, kinds)

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, kinds)

    return PerDevice(real.__name__, (), {"__doc__": real.__doc__, "__module__": "torch"})


class _DeviceContext(contextlib.nullcontext):
    """``torch.cuda.device(i)``: one virtual device, so selecting it changes nothing."""

    def __init__(self, device: Any = None):
        super().__init__()
        self.idx = _device_index(device)


def _device_index(device: Any, current: int = 0) -> int:
    """The index ``device`` names (``None`` and a bare ``"cuda"``: the current device)."""
    if device is None:
        return current
    if isinstance(device, int):
        return device
    d = torch.device(device) if isinstance(device, str) else device
    if not isinstance(d, torch.device) or d.index is None:
        return current
    return d.index


def autocast_methods(vc: "VirtualCuda") -> tuple[Callable, Callable]:
    """``autocast.__enter__`` / ``__exit__`` for the virtual device (patched on the base class,
    so ``torch.autocast``, ``torch.amp.autocast``, ``torch.cuda.amp.autocast``, decorators,
    ``torch.utils.checkpoint``'s recomputation and names imported before tracing all take them;
    an autocast *object* built before tracing was disabled by torch itself, as no GPU existed).

    A ``"cuda"`` region sets the CUDA autocast state as on a GPU (``torch.is_autocast_enabled
    ("cuda")``, ``torch.get_autocast_dtype("cuda")`` answer what the code asked for) and also
    enables CPU autocast, whose dispatch key is the one the CPU tensors carry; the kernels behind
    that key are CUDA's policy while CUDA regions are in use (``autocast_policy.py``). A
    ``"cpu"`` region outside any CUDA region gets CPU's own policy back; inside one, the CPU
    state keeps following the CUDA state (it is the virtual GPU's switch there).
    """
    base = torch.amp.autocast_mode.autocast
    orig_enter, orig_exit = base.__enter__, base.__exit__

    def __enter__(self: Any) -> Any:
        out = orig_enter(self)
        if torch._jit_internal.is_scripting():
            return out
        if self.device == "cuda":
            self.__dict__.setdefault("_xmem_cpu_prev", []).append(torch.is_autocast_enabled("cpu"))
            vc.autocast_depth += 1
            if self._enabled:
                vc.autocast.install()
            torch.set_autocast_enabled("cpu", self._enabled)
        elif self.device == "cpu":
            if vc.autocast_depth:
                # inside a CUDA region the CPU key serves the virtual GPU: it follows CUDA's
                # state (host tensors are never cast by the CUDA policy)
                torch.set_autocast_enabled("cpu", torch.is_autocast_enabled("cuda"))
            elif self._enabled:
                vc.autocast.uninstall()
        return out

    def __exit__(self: Any, exc_type: Any, exc_val: Any, exc_tb: Any) -> Any:
        out = orig_exit(self, exc_type, exc_val, exc_tb)
        prev = self.__dict__.get("_xmem_cpu_prev")
        if prev and self.device == "cuda":
            torch.set_autocast_enabled("cpu", prev.pop())
            vc.autocast_depth -= 1
        return out

    return __enter__, __exit__


def _grad_scaler_methods() -> dict[str, Callable]:
    """``GradScaler`` methods that read tensor values, for fake tensors.

    In fake mode ``.item()`` of ``found_inf`` / ``_scale`` gives a placeholder (``placeholders.py``).
    ``_maybe_opt_step`` then takes the step (a placeholder ``found_inf`` counts as finite, the
    case a memory estimate is about: a skipped step allocates no optimizer state), and
    ``get_scale`` / ``_get_growth_tracker`` answer the values ``_amp_update_scale_`` gives
    when no step finds an inf (``scale_before > scaler.get_scale()`` overflow checks then
    need no real values). Real values are used whenever ``.item()`` gives them.
    """
    from torch.amp.grad_scaler import GradScaler

    orig_update = GradScaler.update
    orig_get_scale = GradScaler.get_scale
    orig_get_growth_tracker = GradScaler._get_growth_tracker
    orig_load_state_dict = GradScaler.load_state_dict

    def placeholder(x: Any) -> bool:
        return isinstance(x, (FakeFloat, FakeInt))

    def _maybe_opt_step(self: Any, optimizer: Any, optimizer_state: dict, *args: Any, **kwargs: Any) -> Any:
        found = 0.0
        for v in optimizer_state["found_inf_per_device"].values():
            x = v.item()
            if not placeholder(x):
                found += x
        if not found:
            return optimizer.step(*args, **kwargs)
        return None

    def shadow(self: Any) -> tuple[float, int]:
        return self.__dict__.get("_xmem_shadow", (self._init_scale, self._init_growth_tracker))

    def update(self: Any, new_scale: Any = None) -> None:
        orig_update(self, new_scale)
        if self._enabled:
            scale, tracker = shadow(self)
            if new_scale is not None:
                if isinstance(new_scale, float):
                    scale = new_scale
            else:
                tracker += 1
                if tracker == self._growth_interval:
                    scale, tracker = scale * self._growth_factor, 0
            self.__dict__["_xmem_shadow"] = (scale, tracker)

    def load_state_dict(self: Any, state_dict: dict) -> None:
        self.__dict__.pop("_xmem_shadow", None)  # the shadow starts again from the loaded scale
        orig_load_state_dict(self, state_dict)

    def get_scale(self: Any) -> float:
        value = orig_get_scale(self)
        return float(shadow(self)[0]) if placeholder(value) else value

    def _get_growth_tracker(self: Any) -> int:
        value = orig_get_growth_tracker(self)
        return int(shadow(self)[1]) if placeholder(value) else value

    return {"_maybe_opt_step": _maybe_opt_step, "update": update, "get_scale": get_scale,
            "_get_growth_tracker": _get_growth_tracker, "load_state_dict": load_state_dict}


@contextlib.contextmanager
def patched_cuda(vc: VirtualCuda) -> Iterator[VirtualCuda]:
    """Install the virtual device's ``torch.cuda`` functions; restore the originals after."""
    import torch.cuda.memory as cuda_memory
    import torch.cuda.nvtx as nvtx
    import torch.cuda.random as cuda_random  # Trainer's checkpoints call torch.cuda.random.get_rng_state

    # Dynamo reads torch.cuda's functions into its tables when first imported (constant folding,
    # context managers); imported first inside a trace, it kept the virtual device's, and through
    # them the first trace's device and tracer, for the life of the process. So it comes first.
    import torch._dynamo  # noqa: F401

    stack = contextlib.ExitStack()

    def patch(mod: Any, name: str, fn: Any) -> None:
        stack.enter_context(patched_attr(mod, name, fn))

    cpu_autocast = torch.is_autocast_enabled("cpu")
    try:
        for name, fn in vc.functions().items():
            patch(torch.cuda, name, fn)
            if hasattr(cuda_memory, name):
                patch(cuda_memory, name, fn)
            if hasattr(cuda_random, name):
                patch(cuda_random, name, fn)
            if hasattr(torch.cuda.graphs, name):  # (make_graphed_callables reads the module's own names)
                patch(torch.cuda.graphs, name, fn)
        # torch.accelerator (2.6+) is the device-generic front of the same calls; on a CUDA
        # build without a GPU it would ask the driver, so it answers for the virtual GPU too.
        accelerator = getattr(torch, "accelerator", None)
        if accelerator is not None:
            fns = vc.functions()
            generic = {
                "is_available": lambda *a, **k: True,
                "device_count": lambda *a, **k: vc.count,
                "current_accelerator": lambda *a, **k: torch.device("cuda"),
                "current_device_index": lambda *a, **k: vc.index,
                "current_device_idx": lambda *a, **k: vc.index,
                "set_device_index": lambda device, *a, **k: fns["set_device"](device),
                "set_device_idx": lambda device, *a, **k: fns["set_device"](device),
                "current_stream": lambda *a, **k: vc.current_stream,
                "device_index": _DeviceContext,
                "get_memory_info": lambda *a, **k: fns["mem_get_info"](),
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
        # A library that keeps the current CUDA stream's handle per device at import (Unsloth's
        # kernels, for its Triton launches) asks torch._C itself: the virtual stream's (a CPU
        # build has no such function: it gets one for the trace).
        patch(torch._C, "_cuda_getCurrentRawStream", lambda device=None: vc.current_stream.stream_id)
        # Device-generic streams and events (torch.Stream(), torch.Event(device=...); transformers'
        # offloaded KV cache makes one) are the virtual device's where they name the GPU.
        patch(torch, "Stream", _per_device(torch.Stream, VirtualStream, None, VirtualStream))
        patch(torch, "Event", _per_device(torch.Event, lambda device, *a, **k: VirtualEvent(*a, **k), None, VirtualEvent))
        # torch.Generator(device="cuda") (diffusers' scripts seed one): a CPU generator, which the
        # tracer's tensors (CPU ones underneath) draw from; torch.Generator() is the CPU's
        cpu_generator = torch.Generator
        patch(torch, "Generator", _per_device(cpu_generator, lambda device: cpu_generator("cpu"), "cpu"))
        # The process's accelerator is the virtual GPU (FSDP2's default mesh asks torch._C).
        if hasattr(torch._C, "_get_accelerator"):
            patch(torch._C, "_get_accelerator", lambda *a, **k: torch.device("cuda"))
        # Autocast regions for "cuda" follow CUDA's cast lists (autocast_policy.py).
        enter, exit_ = autocast_methods(vc)
        patch(torch.amp.autocast_mode.autocast, "__enter__", enter)
        patch(torch.amp.autocast_mode.autocast, "__exit__", exit_)
        orig_clear = torch.clear_autocast_cache

        def clear_autocast_cache() -> None:
            orig_clear()
            vc.autocast.clear_cache()

        patch(torch, "clear_autocast_cache", clear_autocast_cache)
        from torch.amp.grad_scaler import GradScaler

        for name, fn in _grad_scaler_methods().items():
            patch(GradScaler, name, fn)
        # NVTX annotations are profiler markers: nothing to do without a GPU profiler.
        for name in ("range_push", "range_pop", "range_start", "range_end", "mark"):
            patch(nvtx, name, lambda *args, **kwargs: 0)
        patch(nvtx, "range", lambda *args, **kwargs: contextlib.nullcontext())
        yield vc
    finally:
        vc.autocast.uninstall()  # also drops the weight cache
        if vc.autocast_depth:  # a region left open (a generator never resumed): CPU autocast off again
            torch.set_autocast_enabled("cpu", cpu_autocast)
            vc.autocast_depth = 0
        stack.close()
