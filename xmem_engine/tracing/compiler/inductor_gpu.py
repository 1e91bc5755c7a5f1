"""The virtual GPU as Dynamo, Inductor and Triton see it while ``torch.compile`` runs on the CPU.

Every query a compiler makes about "the" CUDA device (Dynamo's device interface, Triton's
driver and target, Inductor's device properties and ``functools.cache``d answers) is answered
for the target GPU; Triton kernels become :class:`NoopKernel`; the generated wrapper's
driver calls are made virtual (:func:`virtualize_wrapper`); no worker pool, no benchmarking
(its allocations are made instead, ``inductor_autotune.py``); Inductor's compiled graphs kept in
xmem's own cache (``compile_cache.py``). ``torch_compile.py`` enters
:func:`inductor_for_virtual_gpu` for a trace that compiles. Research: ``docs/compile-on-cpu.md``.
"""

from __future__ import annotations

import contextlib
import os
import types
from typing import Any, Callable, Iterator

import torch

from xmem_engine.tracing.compiler.compile_cache import CACHE_DIR_VAR, compile_cache_dir, make_room
from xmem_engine.tracing.compiler.inductor_autotune import (autotune_of, benchmark_allocations, flush_bytes,
                                                            kernel_def, pad_mm_should_pad)
from xmem_engine.tracing.patches import patched_attr, patched_item


def _machine_has_cuda() -> bool:
    """``torch.cuda.is_available()`` as this machine answers it, whatever the tracer patched:
    with ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (Lightning sets it when imported) torch's own
    function asks ``torch.cuda.device_count()``, which is the virtual GPU's while tracing, and
    every compile after ``import lightning`` looked for a driver."""
    return torch.cuda._is_compiled() and torch._C._cuda_getDeviceCount() > 0


def availability() -> tuple[Callable[..., Any], Callable[..., Any] | None]:
    """``torch.cuda.is_available`` and ``torch.accelerator.current_accelerator`` as they are now
    (None: this torch has no ``torch.accelerator``), for :func:`answering_availability`."""
    return torch.cuda.is_available, getattr(getattr(torch, "accelerator", None), "current_accelerator", None)


#: the two as this machine answers them (no GPU without a driver), taken before the tracer
#: patches them to say the virtual GPU is there: a compiler must see the truth
REAL_AVAILABILITY = (_machine_has_cuda, availability()[1])


@contextlib.contextmanager
def answering_availability(answers: tuple[Callable[..., Any], Callable[..., Any] | None]) -> Iterator[None]:
    """``torch.cuda.is_available`` and ``torch.accelerator.current_accelerator`` answered by
    ``answers`` (an :func:`availability` pair) for the block, put back after."""
    is_available, current_accelerator = answers
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched_attr(torch.cuda, "is_available", is_available))
        if current_accelerator is not None:
            stack.enter_context(patched_attr(torch.accelerator, "current_accelerator", current_accelerator))
        yield


@contextlib.contextmanager
def real_availability() -> Iterator[None]:
    """``torch.cuda.is_available()`` False (and no current accelerator) while compiling, as on
    this machine: FakeTensorMode then installs CUDA's no-op device guard and makes its ``cuda``
    tensors without initialising CUDA (Inductor's pattern tracing makes some), and Dynamo asks
    no driver for RNG states or stream captures. The compilers' questions about the GPU itself
    are answered by :func:`inductor_for_virtual_gpu`. An autocast region built meanwhile (a
    compiled graph's ``_enter_autocast``, traced by AOTAutograd) asks the same question; it
    must stay on: answered False, the compiled step's matmuls had run in float32."""
    import torch.cuda.amp.common as amp_common

    with answering_availability(REAL_AVAILABILITY), \
            patched_attr(amp_common, "amp_definitely_not_available", lambda: False):
        yield


# ---------------------------------------------------------------- the virtual GPU, as Inductor sees it
#: shared memory per block (opt-in) by compute capability: Triton's heuristics read it
_SHARED_MEMORY_OPTIN = {(7, 0): 98_304, (7, 5): 65_536, (8, 0): 166_912, (8, 6): 101_376, (8, 7): 166_912,
                        (8, 9): 101_376, (9, 0): 232_448, (10, 0): 232_448, (12, 0): 101_376}
_THREADS_PER_SM = {(7, 5): 1024, (8, 6): 1536, (8, 9): 1536, (12, 0): 1536}


def inductor_properties(props: Any) -> types.SimpleNamespace:
    """``torch.cuda.get_device_properties`` for Inductor and Triton: the target GPU's, with the
    fields their heuristics read (the tracer's own properties carry only what user code asks)."""
    cc = (props.major, props.minor)
    return types.SimpleNamespace(
        name=props.name, major=props.major, minor=props.minor, total_memory=props.total_memory,
        multi_processor_count=props.multi_processor_count, is_integrated=False, is_multi_gpu_board=False,
        L2_cache_size=getattr(props, "L2_cache_size", 41_943_040), warp_size=32, gcnArchName="NVIDIA CUDA",
        regs_per_multiprocessor=65_536, max_threads_per_multi_processor=_THREADS_PER_SM.get(cc, 2048),
        max_threads_per_block=1024, shared_memory_per_block=49_152,
        shared_memory_per_block_optin=_SHARED_MEMORY_OPTIN.get(cc, 101_376),
        shared_memory_per_multiprocessor=_SHARED_MEMORY_OPTIN.get(cc, 101_376) + 1024,
        uuid="xmem-virtual-gpu", pci_bus_id=0, pci_device_id=0, pci_domain_id=0,
        clock_rate=1_500_000, memory_clock_rate=1_500_000, memory_bus_width=4096)


class NoopKernel:
    """What ``AsyncCompile.triton`` gives back: a launch that computes nothing. Its first launch
    allocates what the GPU's autotuning of its configs would (``inductor_autotune.py``). Each
    launch tells what it would have written (:attr:`on_written`): in fake mode the values known
    of those tensors go, as they do for a Triton launch from Python (a compiled ``buf.add_(1)``
    had left ``buf``'s known zeros in place, and a buffer Inductor allocates empty kept the
    host's uninitialised bytes as its known values)."""

    flush: int  # the cache-flush buffer timing allocates for the target GPU (inductor_for_virtual_gpu)
    on_written: Callable[[list], None] = staticmethod(lambda tensors: None)

    def __init__(self, name: str, source: str):
        self.name, self.source = name, source
        self.launches = 0
        self.autotune = autotune_of(name, source)
        self.writes = _written_positions(name, source, self.autotune)

    def run(self, *args: Any, **kwargs: Any) -> None:
        if self.launches == 0 and self.autotune is not None and self.autotune.configs > 1:
            benchmark_allocations(self.autotune, args, self.flush)
        self.launches += 1
        positions = range(len(args)) if self.writes is None else self.writes
        written = [args[i] for i in positions if i < len(args) and isinstance(args[i], torch.Tensor)]
        if written:
            self.on_written(written)

    __call__ = run


def _written_positions(name: str, source: str, autotune: Any) -> tuple[int, ...] | None:
    """The positions of the arguments generated kernel ``name`` writes: those Inductor names
    ``out_ptr<n>`` or ``in_out_ptr<n>`` (templates' outputs too), and the inputs it mutates in
    place (``mutated_arg_names``). None, every tensor, where the signature cannot be read."""
    if autotune is not None:
        names, mutated = autotune.arg_names, autotune.mutated
    else:
        fn = kernel_def(name, source)
        if fn is None:
            return None
        names, mutated = tuple(a.arg for a in fn.args.args), frozenset()
    return tuple(i for i, n in enumerate(names) if n.startswith(("out_ptr", "in_out_ptr")) or n in mutated)


class _NullGuard:
    """``torch.cuda._DeviceGuard`` in the generated wrapper: one virtual GPU, nothing to switch."""

    def __init__(self, index: int):
        pass

    def __enter__(self) -> "_NullGuard":
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False


def virtualize_wrapper(mod: types.ModuleType) -> None:
    """The generated wrapper module's globals that would reach the CUDA driver, made virtual."""
    g = vars(mod)
    # Under the device mode this is a recorded allocation on the virtual GPU.
    g["empty_strided_cuda"] = lambda size, stride, dtype: torch.empty_strided(size, stride, dtype=dtype, device="cuda")
    g["get_raw_stream"] = lambda index=0: 0
    if "empty_strided_cpu_pinned" in g:  # a compiled .to("cpu", non_blocking=True): host memory, pinned by the driver
        g["empty_strided_cpu_pinned"] = lambda size, stride, dtype: torch.empty_strided(size, stride, dtype=dtype)
    # The C++ helper builds a raw TensorImpl over the storage (a meta tensor, for a fake one).
    g["reinterpret_tensor"] = lambda base, size, stride, offset: torch.as_strided(
        base, size, stride, base.storage_offset() + offset)
    if "copy_if_misaligned" in g:
        g["copy_if_misaligned"] = lambda t: t
    if "alloc_from_pool" in g:  # config.memory_planning (Unsloth turns it on): buffers carved out of pools
        g["alloc_from_pool"] = alloc_from_pool
    g["assert_alignment"] = lambda *a, **k: None


def alloc_from_pool(pool: torch.Tensor, offset_bytes: int, dtype: torch.dtype, size: Any, stride: Any) -> torch.Tensor:
    """``torch.ops.inductor._alloc_from_pool`` as views: a ``dtype`` tensor over the pool's bytes
    from ``offset_bytes``. The C++ op builds a raw TensorImpl over the storage, which for a fake
    pool is a meta tensor that the next op refuses ("found two devices, cpu and meta"); views
    allocate nothing, and keep the pool alive as long as the buffer, as on the GPU."""
    if pool.dtype != dtype and pool.dtype == torch.uint8 and pool.dim() == 1 and pool.storage_offset() == 0 \
            and pool.numel() % dtype.itemsize == 0 and pool.numel() == pool.untyped_storage().nbytes():
        pool = pool.view(dtype)  # the usual byte pool, seen as ``dtype`` in one view
    elif pool.dtype != dtype:  # another dtype's pool, or a part of a storage: the whole storage, seen as ``dtype``
        whole = pool.as_strided((pool.untyped_storage().nbytes() // pool.element_size(),), (1,), 0)
        raw = whole.view(torch.uint8)
        pool = raw[:raw.numel() // dtype.itemsize * dtype.itemsize].view(dtype)
    return torch.as_strided(pool, size, stride, offset_bytes // dtype.itemsize)


class _CudaToCpu(torch.utils._python_dispatch.TorchDispatchMode):
    """Real (not fake) ops Inductor runs at compile time on ``cuda`` (constant folding asks for
    values) run on the CPU: only values and storage identities are read."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        d = kwargs.get("device")
        if d is not None and torch.device(d).type == "cuda":
            kwargs["device"] = torch.device("cpu")
        schema = getattr(func, "_schema", None)
        if schema is not None:  # a positional device (``prims.device_put(a, device)``)
            for i, arg in enumerate(schema.arguments[:len(args)]):
                if arg.name == "device" and isinstance(args[i], (torch.device, str)) and torch.device(args[i]).type == "cuda":
                    args = (*args[:i], torch.device("cpu"), *args[i + 1:])
        return func(*args, **kwargs)


def _constants_on_cpu(unset_fake: Callable[[], Any]) -> Callable[[], Any]:
    """``unset_fake_temporarily`` for make_fx's constant propagation (proxy_tensor.py): there
    AOTAutograd computes an op on small constant tensors for real, a ``.to("cuda")`` of one
    among them (transformers' ``DynamicCache`` makes ``torch.tensor([], device="cuda")`` in a
    compiled forward), which needs a driver; on the CPU the constant's values are the same."""

    @contextlib.contextmanager
    def unset() -> Iterator[Any]:
        with unset_fake() as mode, _CudaToCpu():
            yield mode

    return unset


def _enter_caches(stack: contextlib.ExitStack, icfg: Any, props: Any) -> None:
    """Inductor's FX graph cache on, in :func:`compile_cache_dir`, for the stack's life; every
    other compile cache (AOTAutograd's, autotuning's, remote ones) off."""
    import torch._functorch.config as fcfg

    where = compile_cache_dir(props)
    if where is not None:
        try:
            make_room(where, about={"gpu": str(props.name), "torch": torch.__version__})
        except OSError as e:  # a read-only home on a cluster's compute node: estimate without the cache
            import warnings

            warnings.warn(f"xmem's compile cache is off for this estimate: {e}. Set {CACHE_DIR_VAR} to a "
                          f"writable folder (or to off)", RuntimeWarning, stacklevel=2)
            where = None
    settings = dict(force_disable_caches=where is None, fx_graph_cache=where is not None, fx_graph_remote_cache=False,
                    autotune_local_cache=False, autotune_remote_cache=False, bundled_autotune_remote_cache=False)
    for key, value in settings.items():
        if hasattr(icfg, key):
            stack.enter_context(icfg.patch(key, value))
    if hasattr(fcfg, "enable_autograd_cache"):
        stack.enter_context(fcfg.patch("enable_autograd_cache", False))
    if where is not None:
        # torch's cache_dir() writes the variable back into os.environ: it is put back after
        stack.enter_context(patched_item(os.environ, "TORCHINDUCTOR_CACHE_DIR", where))
        _answer_cache_dir(stack, where)
    # Nothing compiled here reaches torch's portable artifacts (torch.compiler.save_cache_artifacts,
    # which Unsloth's "mega-cache" saves at exit and loads into later runs, on a GPU too)
    try:
        from torch.compiler._cache import CacheArtifactManager
    except ImportError:  # torch < 2.7: no portable artifacts
        return
    stack.enter_context(patched_attr(CacheArtifactManager, "record_artifact", classmethod(lambda cls, *a, **k: None)))


def _answer_cache_dir(stack: contextlib.ExitStack, where: str) -> None:
    """torch's ``cache_dir()`` answers ``where`` in every module that imported it, whatever the
    environment says: Unsloth's patching pops ``TORCHINDUCTOR_CACHE_DIR`` mid-run, after which
    Inductor read and wrote xmem's graphs in torch's own folder. A module imported meanwhile keeps
    the stand-in, which asks the original again once the stack has closed."""
    import sys

    from torch._inductor.runtime import cache_dir_utils

    original, active = cache_dir_utils.cache_dir, [True]  # (the module's own is put back after each trace)

    def cache_dir() -> str:
        if not active[0]:
            return original()
        os.makedirs(where, exist_ok=True)
        return where

    cache_dir.original = original  # type: ignore[attr-defined]
    for name, mod in list(sys.modules.items()):
        found = vars(mod).get("cache_dir") if name == "torch" or name.startswith("torch.") else None
        if found is original or getattr(found, "original", None) is original:
            stack.enter_context(patched_attr(mod, "cache_dir", cache_dir))
    stack.callback(active.__setitem__, 0, False)


@contextlib.contextmanager
def inductor_for_virtual_gpu(props: Any, on_wrapper: Callable[[types.ModuleType], None] = lambda mod: None,
                             on_pad_timing: Callable[[list], None] = lambda steps: None,
                             on_written: Callable[[list], None] = lambda tensors: None) -> Iterator[None]:
    """Dynamo's device interface, Triton's driver and Inductor's compile-time queries answered
    for the target GPU; Triton kernels made into :class:`NoopKernel` (``on_written``: the tensors
    a launch writes); Inductor's graph cache in xmem's directory, no other cache, no worker pool,
    no benchmarking. Everything is put back on exit."""
    import sys

    import torch._dynamo.device_interface as di
    import torch._inductor.config as icfg
    import triton.runtime.driver  # noqa: F401
    from torch._inductor.async_compile import AsyncCompile
    from torch._inductor.codecache import PyCodeCache
    from torch._inductor.fx_passes import joint_graph, pad_mm
    from torch.fx.experimental import proxy_tensor
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.driver import CudaDriver

    p = inductor_properties(props)
    cc = p.major * 10 + p.minor

    class VirtualCudaInterface(di.CudaInterface):  # type: ignore[misc, valid-type]
        class Worker:
            set_device = staticmethod(lambda device: None)
            current_device = staticmethod(lambda: 0)
            get_device_properties = staticmethod(lambda device=None: p)

        current_device = staticmethod(lambda: 0)
        set_device = staticmethod(lambda device: None)
        device_count = staticmethod(lambda: 1)
        synchronize = staticmethod(lambda device=None: None)
        get_device_properties = staticmethod(lambda device=None: p)
        get_raw_stream = staticmethod(lambda device=0: 0)
        exchange_device = staticmethod(lambda device: 0)
        maybe_exchange_device = staticmethod(lambda device: 0)
        memory_allocated = staticmethod(lambda device=None: 0)
        is_bf16_supported = staticmethod(lambda including_emulation=False: p.major >= 8)
        is_available = staticmethod(lambda: True)
        get_compute_capability = staticmethod(lambda device=None: cc)
        is_triton_capable = staticmethod(lambda device=None: True)

    class VirtualUtils:
        def get_device_properties(self, device: int = 0) -> dict:
            return {"max_shared_mem": p.shared_memory_per_block_optin, "multiprocessor_count": p.multi_processor_count,
                    "max_num_regs": p.regs_per_multiprocessor, "warpSize": 32, "sm_clock_rate": p.clock_rate,
                    "mem_clock_rate": p.memory_clock_rate, "mem_bus_width": p.memory_bus_width}

    class VirtualCudaDriver(CudaDriver):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:  # CudaDriver's would build a C helper against libcuda
            self.utils = VirtualUtils()

        def get_current_target(self) -> Any:
            return GPUTarget("cuda", cc, 32)

        def get_current_device(self) -> int:
            return 0

        def set_current_device(self, device: int) -> None:
            pass

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

        def get_device_capability(self, device: int = 0) -> tuple[int, int]:
            return (p.major, p.minor)

        def get_active_torch_device(self) -> torch.device:
            return torch.device("cuda", 0)

        @staticmethod
        def is_active() -> bool:
            return True

    orig_load = PyCodeCache.load_by_key_path.__func__

    def load_by_key_path(cls: Any, *args: Any, **kwargs: Any) -> Any:
        mod = orig_load(cls, *args, **kwargs)
        if "empty_strided_cuda" in vars(mod):
            virtualize_wrapper(mod)
            on_wrapper(mod)
        return mod

    orig_fold = joint_graph.UniformValueConstantFolder.run

    def fold(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _CudaToCpu():
            return orig_fold(self, *args, **kwargs)

    tdrv = sys.modules["triton.runtime.driver"].driver
    with contextlib.ExitStack() as stack:
        P = lambda obj, name, value: stack.enter_context(patched_attr(obj, name, value))  # noqa: E731
        P(torch.cuda, "set_device", lambda device: None)
        P(torch.cuda, "_DeviceGuard", _NullGuard)
        P(torch.cuda, "get_device_properties", lambda device=None: p)
        names = ("_active", "_default") if hasattr(tdrv, "_active") else ("active", "default")  # triton < 3.3
        old, virtual = [getattr(tdrv, n) for n in names], VirtualCudaDriver()
        for n in names:
            setattr(tdrv, n, virtual)
        stack.callback(lambda: [setattr(tdrv, n, o) for n, o in zip(names, old)])
        _enter_caches(stack, icfg, p)
        for key, value in dict(compile_threads=1, max_autotune=False,
                               max_autotune_gemm=False, max_autotune_pointwise=False, cpp_wrapper=False).items():
            if hasattr(icfg, key):
                stack.enter_context(icfg.patch(key, value))
        stack.enter_context(icfg.patch("triton.cudagraphs", False))
        # A checkpointed region's dropout, recomputed in backward: the GPU keeps its RNG state in
        # generator objects passed to the graphs ("graph-safe"); there are none without a driver
        # (torch.cuda.default_generators is empty: "tuple index out of range" while partitioning).
        # Saved as a state tensor instead: 16 host bytes per op, no GPU memory either way.
        import torch._functorch.config as fcfg

        if hasattr(fcfg, "graphsafe_rng_functionalization"):
            stack.enter_context(fcfg.patch("graphsafe_rng_functionalization", False))
        flush = flush_bytes(p.L2_cache_size)
        P(NoopKernel, "flush", flush)
        P(NoopKernel, "on_written", staticmethod(on_written))
        P(AsyncCompile, "triton", lambda self, kernel_name, source_code, device_str="cuda": NoopKernel(kernel_name, source_code))
        P(AsyncCompile, "wait", lambda self, scope: None)
        P(PyCodeCache, "load_by_key_path", classmethod(load_by_key_path))
        P(joint_graph.UniformValueConstantFolder, "run", fold)
        P(proxy_tensor, "unset_fake_temporarily", _constants_on_cpu(proxy_tensor.unset_fake_temporarily))
        P(torch._C, "_conv_determine_backend_memory_format",
          _conv_layout_as_on_gpu(torch._C._conv_determine_backend_memory_format))
        # pad_mm times padded and unpadded matmuls on real GPU tensors: its allocations are
        # reported (on_pad_timing), half-precision matmuls padded (inductor_autotune.py)
        timing = next((n for n in ("_should_pad", "_should_pad_bench") if hasattr(pad_mm, n)), None)  # 2.14, 2.10
        if timing is not None:
            P(pad_mm, timing, pad_mm_should_pad(on_pad_timing, flush))
        elif hasattr(pad_mm, "get_cached_should_pad"):
            P(pad_mm, "get_cached_should_pad", lambda key: False)
        di.get_interface_for_device("cpu")  # the registry is filled on first use
        stack.enter_context(patched_item(di.device_interfaces, "cuda", VirtualCudaInterface))
        stack.enter_context(patched_item(di.device_interfaces, "cuda:0", VirtualCudaInterface))
        # functools.cache'd answers about "the" GPU: this trace's target, none left behind
        caches = _device_caches()
        for c in caches:
            c.cache_clear()
        stack.callback(lambda: [c.cache_clear() for c in caches])
        yield


def _conv_layout_as_on_gpu(original: Callable[..., Any]) -> Callable[..., Any]:
    """The layout Inductor expects of a CUDA convolution's output, as the tracer gives it
    (``conv_layout.cuda_layout``, cuDNN's rule). FakeTensor's convolution asks
    ``torch._C._select_conv_backend``, which on this machine cannot confirm cuDNN's bf16
    support (it reads the GPU's compute capability from the driver) and so picks a non-cuDNN
    backend, laid out contiguous: a compiled bf16 CNN asserted a contiguous output where the
    GPU, and the traced convolution, give channels-last (timm's ``train.py --amp-dtype
    bfloat16 --torchcompile`` stopped at its first convolution)."""
    from torch._subclasses.fake_tensor import FakeTensor

    from xmem_engine.tracing.kernels.conv_layout import cuda_layout

    def determine(input: Any, weight: Any, backend: Any) -> Any:
        if isinstance(input, FakeTensor) and input.fake_device.type == "cuda" and isinstance(weight, torch.Tensor):
            return cuda_layout(input, weight)
        return original(input, weight, backend)

    return determine


def _device_caches() -> list[Any]:
    """Inductor's and Triton's ``functools.cache``d answers about the GPU."""
    found = []
    for modname, name in (("torch._inductor.runtime.hints", "DeviceProperties.create"),
                          ("torch.utils._triton", "triton_backend"), ("torch.utils._triton", "triton_hash_with_backend"),
                          ("torch.utils._triton", "has_triton"),
                          ("torch._inductor.utils", "is_big_gpu"), ("torch._inductor.utils", "get_gpu_shared_memory"),
                          ("torch._inductor.codecache", "CacheBase.get_system")):
        import importlib

        try:
            obj: Any = importlib.import_module(modname)
        except ImportError:
            continue
        for part in name.split("."):
            obj = getattr(obj, part, None)
        if obj is not None and hasattr(obj, "cache_clear"):
            found.append(obj)
    return found
