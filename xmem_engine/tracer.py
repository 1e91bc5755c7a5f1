"""The tracer: run code written for ``cuda`` on the CPU and record its GPU memory requests.

How it works
------------
* A :class:`torch.overrides.TorchFunctionMode` (``_DeviceMode``) is the *virtual CUDA
  device*: it rewrites ``device="cuda"``, ``.cuda()``, ``.to("cuda")`` ... to the CPU, makes
  tensors that live "on the GPU" report ``cuda:0`` (``.device``, ``.is_cuda``), and marks the
  phases (``backward()``). ``virtual_cuda.patched_cuda`` answers ``torch.cuda.*``.
* A :class:`torch.utils._python_dispatch.TorchDispatchMode` (``_AllocMode``) sees every aten
  op. A storage it has not seen before is an allocation; it is "on the GPU" when the op was
  a transfer to / factory on ``cuda`` or read a GPU storage. A weakref on the storage
  reports the free at the moment the storage dies - the moment the caching allocator would
  get the block back. Views share their storage (no allocation); in-place ops allocate nothing.
* ``mode="fake"`` runs the GPU side under :class:`FakeTensorMode` (no arithmetic, no memory):
  every tensor on the virtual GPU and every ``nn.Parameter`` is fake, and so is a host
  tensor made by a factory larger than ``HOST_REAL_BYTES``; other CPU-side work (data
  loading, samplers, metrics on CPU tensors) runs for real, so it sees real values.
  Weight initialisers (``torch.nn.init``) leave fake tensors alone. ``.item()`` of a fake
  tensor gives a placeholder number that may be printed or summed, but raises (and makes
  ``auto`` fall back) once it decides control flow. Small GPU tensors whose values are
  known (masks, ids, labels moved from the host, and what deterministic ops make of them)
  keep a real copy, so branches on them and ``nonzero`` stay in fake mode
  (``shadow_values.py``).
  ``mode="real"`` runs on real CPU tensors; ``mode="auto"`` tries fake and falls back to
  real (``trace.meta["fallback"]`` says why) when the code needs tensor values of the GPU
  side (data-dependent shapes such as ``nonzero`` or boolean masks, values in control
  flow). A fallback re-runs the code from the start. A few hot ops (convolution, batch norm
  and their backwards, copies, simple in-place ops) take shortcuts in fake mode that give the
  outputs FakeTensorMode's kernels give, faster (``tests/test_tracer_fastpaths.py``).
* The tracer records what this CPU run does with the CUDA defaults it can see at trace
  time (tensors report ``cuda``, so optimizers pick ``foreach``). Two kernels are rewritten
  to allocate as on the target GPU: dropout (``native_dropout``'s bool mask) and
  ``scaled_dot_product_attention`` (the backend CUDA would pick for the target's compute
  capability, ``sdpa.py``); other differences (cuBLAS / cuDNN workspaces, autocast cast
  lists) are ``cuda_behaviour.py``'s business. oneDNN is switched off so that real CPU execution takes
  the same generic kernels as fake tensors.
* Module hooks give the module path (dotted, relative to the top-level module; the
  top-level module's own ops carry its variable name, or its class name). Backward ops get
  the module that was running when their autograd node was made in the forward.
  Autograd's saved-tensor hooks tell which storages are saved for backward
  (``activation``); parameters, buffers, gradients and optimizer state are recognised from
  the modules and optimizers the code uses, and a storage's category only moves up
  (``_RANK``), so the last word is the most specific one. ``user source`` is the innermost
  frame outside torch, xmem and the standard library.
* CPU-only conveniences: ``DataLoader`` workers load in-process, ``torch.compile`` returns
  the model unchanged, NVTX ranges and CUDA events do nothing.

Phases and iterations
---------------------
``forward`` starts at the forward pre-hook of a top-level module (one called while no
other module runs) and lasts until a backward starts; ``backward`` lasts while
``Tensor.backward`` / ``torch.autograd.backward`` / ``torch.autograd.grad`` run;
``optimizer`` while ``Optimizer.step`` runs; everything else is ``other``. Iteration 0
starts at the first top-level forward; a new iteration starts at the first top-level
forward after an optimizer step (with gradient accumulation, an iteration holds all the
micro-batches of one step), or, while the code has created no optimizer, at the first
top-level forward after a backward. Events before the first forward (model construction,
``.to("cuda")``) carry iteration -1.

What persists in a namespace
----------------------------
When ``code`` is source text it runs in a copy of ``namespace``. Afterwards only *plain*
values that the code bound to names (``None``, bools, numbers, strings, bytes, and lists,
tuples, dicts and sets of those) are copied back; tensors, modules, optimizers, functions
and classes the code made stay behind (they may hold fake tensors or GPU storages). Objects
that existed before are restored to their earlier state (see ``user_state.py``): modules,
optimizers, tensors (binding, values, ``requires_grad``, ``.grad``), lists / dicts / sets
(so nothing appended during tracing stays), the RNG states and common global torch
settings. The same holds for what a callable reaches through its globals and closure.
The callable's return value is discarded.
"""

from __future__ import annotations

import bisect
import builtins
import contextlib
import gc
import linecache
import logging
import os
import sys
import sysconfig
import time
import types
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.utils._device as _device_mod
import torch.utils.data
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from xmem_engine.trace import (
    ALLOC,
    EMPTY_CACHE,
    FREE,
    ITERATION,
    PHASE,
    RECORD_STREAM,
    RESET_PEAK,
    Trace,
    TraceEvent,
)
from xmem_engine import sdpa
from xmem_engine.cuda_behaviour import runs_convolutions
from xmem_engine.fake_fastpaths import FAST_FAKE
from xmem_engine.grad_accumulation import BackwardInPlace
from xmem_engine.shadow_values import Shadows
from xmem_engine.user_state import UserState
from xmem_engine.virtual_cuda import VirtualCuda, VirtualStream, patched_cuda

MODES = ("auto", "fake", "real")
_NO_SEQUENCE_NR = 2**63  # AccumulateGrad and other nodes outside the forward's numbering

# Category precedence: a storage's category only moves up (a parameter stays a parameter
# even when it is also saved for backward).
_RANK = {
    "other": 0,
    "temporary": 1,
    "activation": 2,
    "workspace": 3,
    "input": 3,
    "gradient": 5,
    "optimizer_state": 5,
    "parameter": 6,
    "buffer": 6,
}


class TracerError(Exception):
    """The tracer could not produce a trace (not an error of the user's code)."""


class UnsupportedOpError(TracerError):
    """An op or a value read the chosen mode cannot execute."""

    def __init__(self, op: str, mode: str, reason: str = "", where: str = "", hint: str | None = None):
        self.op, self.mode, self.reason, self.where = op, mode, reason, where
        if hint is None:
            hint = "try --mode real (runs the code on real CPU tensors)" if mode == "fake" else (
                "report it to xmem with the line above"
            )
        at = f" at {where}" if where else ""
        why = f" ({reason})" if reason else ""
        super().__init__(f"{op}{at} cannot be traced in {mode} mode{why}; {hint}")


class _StopTracing(BaseException):
    """Raised at the start of the iteration after ``max_iterations``: the code has shown its
    steady state; the rest of it need not run."""


class _NeedsRealValues(BaseException):
    """Fake tensors cannot go on: the code needs tensor values. A BaseException so that a
    user's ``except Exception`` cannot swallow it."""

    def __init__(self, op: str, reason: str, where: str = ""):
        super().__init__(op, reason, where)
        self.op, self.reason, self.where = op, reason, where


# --------------------------------------------------------------------------- placeholders
def _value_needed(what: str) -> _NeedsRealValues:
    return _NeedsRealValues(what, "a tensor value decides control flow or a shape", _user_frame(3))


class _FakeFloat(float):
    """What ``.item()`` returns for a fake tensor: fine to print or add up, but using it to
    decide control flow needs the real value (``auto`` then re-runs in real mode)."""

    def __bool__(self) -> bool:
        raise _value_needed("Tensor.item() in a condition")

    def _cmp(self, other: object) -> bool:
        raise _value_needed("Tensor.item() in a comparison")

    __lt__ = __le__ = __gt__ = __ge__ = _cmp  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        raise _value_needed("Tensor.item() in a comparison")

    __ne__ = __eq__  # type: ignore[assignment]
    __hash__ = float.__hash__

    def __int__(self) -> int:
        raise _value_needed("int(Tensor.item())")

    def __index__(self) -> int:
        raise _value_needed("Tensor.item() used as an index or size")

    def __round__(self, ndigits: int | None = None) -> Any:
        if ndigits is None:
            raise _value_needed("round(Tensor.item())")
        return float(self).__round__(ndigits)


class _FakeInt(int):
    """Integer counterpart of :class:`_FakeFloat`."""

    __bool__ = _FakeFloat.__bool__
    __lt__ = __le__ = __gt__ = __ge__ = _FakeFloat._cmp  # type: ignore[assignment]
    __eq__ = __ne__ = _FakeFloat.__eq__  # type: ignore[assignment]
    __hash__ = int.__hash__
    __index__ = _FakeFloat.__index__
    __int__ = _FakeFloat.__int__


def _placeholder(dtype: torch.dtype) -> Any:
    # 1 rather than 0 or nan: logging code divides by values, takes logs, checks isfinite.
    if dtype.is_floating_point or dtype.is_complex:
        return _FakeFloat(1.0)
    return _FakeInt(1)


# --------------------------------------------------------------------------- user frames
_LIB_DIRS = tuple(
    os.path.dirname(p) + os.sep
    for p in (torch.__file__, __file__)
) + tuple(
    p + os.sep for p in {sysconfig.get_paths().get("stdlib", ""), sysconfig.get_paths().get("platstdlib", "")} if p
)
_IS_USER: dict[str, bool] = {}


def _is_user_file(filename: str) -> bool:
    r = _IS_USER.get(filename)
    if r is None:
        r = not (filename.startswith(_LIB_DIRS) or filename.startswith("<frozen") or "site-packages" in filename)
        _IS_USER[filename] = r
    return r


_OP_NAMES: dict[Any, str] = {}


def _op_name(func: Any) -> str:
    """``str(func)`` ("aten.mm.default"), remembered: OpOverload builds it on every call."""
    name = _OP_NAMES.get(func)
    if name is None:
        name = _OP_NAMES[func] = str(func)
    return name


def _user_frame(depth: int = 2) -> str:
    """``file:line`` of the innermost frame of user code (not torch, not xmem, not stdlib)."""
    f: types.FrameType | None = sys._getframe(depth)
    while f is not None:
        fn = f.f_code.co_filename
        if _is_user_file(fn):
            return f"{fn}:{f.f_lineno}"
        f = f.f_back
    return ""


# --------------------------------------------------------------------------- live storages
@dataclass(slots=True)
class _Live:
    event: TraceEvent | None  # None for zero-byte storages (no device allocation)
    block: Any
    ref: weakref.ref
    nbytes: int


def _tensors_in(x: Any) -> Iterator[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            if isinstance(y, torch.Tensor):
                yield y
            elif isinstance(y, (list, tuple)):
                yield from _tensors_in(y)


class Tracer:
    """Records one run of user code. Use :func:`trace` / :func:`trace_script` rather than this."""

    def __init__(self, mode: str, allocator: Any = None, device: dict | None = None,
                 max_iterations: int | None = None):
        if mode not in ("fake", "real"):
            raise ValueError(f"mode must be 'fake' or 'real', not {mode!r}")
        self.vc = VirtualCuda(self, device)
        if allocator is None:
            from xmem_engine.allocator import CachingAllocator

            # No capacity: the trace records every request; whether it fits is decided
            # downstream. device_total lets set_per_process_memory_fraction work.
            allocator = CachingAllocator(device_total=self.vc.props.total_memory)
        self.mode = mode
        self.fake = mode == "fake"
        # fake mode: real values of small GPU tensors whose contents are known (shadow_values.py)
        self.shadows: Shadows | None = None
        self.allocator = allocator
        self.events: list[TraceEvent] = []
        self.live: dict[int, _Live] = {}
        self.phase = "other"
        self.iteration = -1
        self.max_iterations = max_iterations
        self.stopped = False
        self.op_hooks: list[Callable[["Tracer", Any, tuple, dict, Any], None]] = []
        self.sdpa_calls = 0  # attention calls whose CUDA backend sdpa.py chose for this GPU
        self._next_id = 0
        self._param_module: dict[int, str] = {}  # id(parameter) -> path of the module owning it
        self._module_stack: list[str] = []
        self._names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._roots: weakref.WeakSet = weakref.WeakSet()
        self._optimizers: weakref.WeakSet = weakref.WeakSet()
        self._root_labels: dict[int, str] = {}
        # Module of each autograd node, by sequence number: the innermost module running
        # when sequence numbers from _seq_bounds[i] on were handed out is _seq_paths[i].
        self._seq_bounds: list[int] = []
        self._seq_paths: list[str] = []
        self._backward_depth = 0
        self._stepped = False
        self._backward_done = False
        self._target: str | None = None  # "gpu" / "host": set by the device mode for one call
        self._explicit = False
        self._call_args: tuple | None = None
        self._call_gpu: bool | None = None
        self._busy = 0
        self._pending_frees: list[int] = []
        self._closed = False
        self._extra_blocks: dict[int, Any] = {}
        self._fake_mode: Any = None
        self.user_state: UserState | None = None  # copy-on-write of the user's tensors

        def tensor_record_stream(t: torch.Tensor, stream: VirtualStream) -> None:
            if not isinstance(stream, VirtualStream):
                raise TypeError(f"record_stream() expects a torch.cuda.Stream, got {type(stream).__name__}")
            self.record_stream(t, stream)

        self._tensor_record_stream = tensor_record_stream  # type: ignore[assignment]

    # ------------------------------------------------------------------ public hooks
    def add_event(self, event: TraceEvent) -> TraceEvent:
        """Append an event made by other code (e.g. a library workspace). ``alloc`` events get
        a fresh id and go through the allocator; ``free`` events release such an id."""
        if event.kind == ALLOC:
            event.id = self._new_id()
            if not event.phase:
                event.phase = self.phase
            event.iteration = self.iteration
            self._extra_blocks[event.id] = self.allocator.malloc(event.bytes, event.stream)
        elif event.kind == FREE and event.id in self._extra_blocks:
            self.allocator.free(self._extra_blocks.pop(event.id))
        self.events.append(event)
        return event

    def register_root(self, module: torch.nn.Module, label: str) -> None:
        """Name a top-level module (its own ops are labelled ``label``)."""
        self._root_labels[id(module)] = label

    # ------------------------------------------------------------------ state
    def _new_id(self) -> int:
        i = self._next_id
        self._next_id += 1
        return i

    def is_gpu(self, t: torch.Tensor) -> bool:
        return t.untyped_storage()._cdata in self.live

    def current_module(self) -> str:
        if self._module_stack:
            return self._module_stack[-1]
        if self._backward_depth:
            node = torch._C._current_autograd_node()
            if node is not None:
                i = bisect.bisect_right(self._seq_bounds, node._sequence_nr()) - 1
                if i >= 0 and node._sequence_nr() < _NO_SEQUENCE_NR:
                    return self._seq_paths[i]
        return ""

    def set_phase(self, phase: str) -> None:
        if phase != self.phase:
            self.phase = phase
            self.events.append(TraceEvent(PHASE, phase=phase, iteration=self.iteration))

    def _new_iteration(self) -> None:
        if self.max_iterations is not None and self.iteration + 1 >= self.max_iterations:
            self.stopped = True
            raise _StopTracing()
        self.iteration += 1
        self._stepped = self._backward_done = False
        self.events.append(TraceEvent(ITERATION, iteration=self.iteration, phase=self.phase))

    def _upgrade(self, t: torch.Tensor | None, category: str, module: str = "") -> None:
        if t is None:
            return
        rec = self.live.get(t.untyped_storage()._cdata)
        if rec is None or rec.event is None:
            return
        if _RANK[category] > _RANK[rec.event.category]:
            rec.event.category = category
        if module and not rec.event.module:
            # Parameters, their gradients and optimizer state belong to the module that owns
            # the parameter (they are often made outside any forward pass, e.g. by .cuda()).
            rec.event.module = module

    def classify_modules(self, modules: Iterable[torch.nn.Module]) -> None:
        for m in modules:
            for name, p in m.named_parameters():
                owner = name.rpartition(".")[0]
                self._param_module[id(p)] = owner
                self._upgrade(p, "parameter", owner)
                self._upgrade(p.grad, "gradient", owner)
            for name, b in m.named_buffers():
                self._upgrade(b, "buffer", name.rpartition(".")[0])

    def classify_optimizer(self, opt: torch.optim.Optimizer) -> None:
        for g in opt.param_groups:
            for p in g["params"]:
                owner = self._param_module.get(id(p), "")
                self._upgrade(p, "parameter", owner)
                self._upgrade(p.grad, "gradient", owner)
        for p, s in opt.state.items():
            if isinstance(s, dict):
                owner = self._param_module.get(id(p), "")
                for v in s.values():
                    if isinstance(v, torch.Tensor):
                        self._upgrade(v, "optimizer_state", owner)

    # ------------------------------------------------------------------ allocations
    def _on_new_storage(self, func: Any, t: torch.Tensor, st: torch.UntypedStorage, key: int, nbytes: int) -> None:
        self._busy += 1
        try:
            ev = None
            block = None
            if nbytes > 0:
                if self._explicit and not self._module_stack and self.phase in ("other", "forward"):
                    category = "input"
                elif self.phase == "other":
                    category = "other"
                else:
                    category = "temporary"
                ev = TraceEvent(
                    ALLOC,
                    id=self._new_id(),
                    bytes=nbytes,
                    stream=self.vc.current_stream.stream_id,
                    category=category,
                    op=_op_name(func),
                    module=self.current_module(),
                    phase=self.phase,
                    dtype=str(t.dtype).removeprefix("torch."),
                    shape=tuple(t.shape),
                    source=_user_frame(4),
                    iteration=self.iteration,
                )
                try:
                    block = self.allocator.malloc(nbytes, ev.stream)
                except RuntimeError as e:  # the simulated device is full (capacity / memory fraction)
                    if type(e).__name__ != "OutOfMemoryError":
                        raise
                    raise torch.OutOfMemoryError(f"CUDA out of memory (simulated by xmem). {e}") from None
                self.events.append(ev)
            self.live[key] = _Live(ev, block, weakref.ref(st, self._storage_died(key)), nbytes)
        finally:
            self._busy -= 1
            if self._pending_frees and not self._busy:
                self._drain()

    def _storage_died(self, key: int) -> Callable[[weakref.ref], None]:
        def cb(_ref: weakref.ref) -> None:
            if self._closed:
                return
            if self._busy:
                self._pending_frees.append(key)
            else:
                self._free(key)

        return cb

    def _drain(self) -> None:
        pending, self._pending_frees = self._pending_frees, []
        for key in pending:
            self._free(key)

    def _free(self, key: int) -> None:
        rec = self.live.pop(key, None)
        if rec is None or rec.event is None:
            return
        a = rec.event
        self.events.append(
            TraceEvent(FREE, id=a.id, bytes=a.bytes, stream=a.stream, category=a.category, op=a.op,
                       module=self.current_module(), phase=self.phase, dtype=a.dtype, shape=a.shape,
                       iteration=self.iteration)
        )
        self._busy += 1
        try:
            self.allocator.free(rec.block)
        finally:
            self._busy -= 1
        if self._pending_frees and not self._busy:
            self._drain()

    def _resized(self, func: Any, t: torch.Tensor, st: torch.UntypedStorage, key: int, nbytes: int) -> None:
        """``resize_`` / ``set_`` grew a GPU storage: a new block replaces the old one."""
        old = self.live.pop(key)
        old.ref = None  # type: ignore[assignment]
        if old.event is not None:
            self.live[key] = old
            self._free(key)
        self._on_new_storage(func, t, st, key, nbytes)

    def record_stream(self, t: torch.Tensor, stream: VirtualStream) -> None:
        rec = self.live.get(t.untyped_storage()._cdata)
        if rec is None or rec.event is None:
            return
        self.events.append(
            TraceEvent(RECORD_STREAM, id=rec.event.id, bytes=rec.event.bytes, stream=rec.event.stream,
                       streams=(stream.stream_id,), phase=self.phase, iteration=self.iteration)
        )
        self.allocator.record_stream(rec.block, stream.stream_id)

    def empty_cache(self) -> None:
        self.events.append(TraceEvent(EMPTY_CACHE, phase=self.phase, iteration=self.iteration))
        self.allocator.empty_cache()

    def reset_peak(self) -> None:
        self.events.append(TraceEvent(RESET_PEAK, phase=self.phase, iteration=self.iteration))
        self.allocator.reset_peak_stats()

    def release_all(self) -> None:
        """Hand every still-live block back to the allocator (after an aborted attempt)."""
        self._closed = True
        for rec in self.live.values():
            if rec.block is not None:
                self.allocator.free(rec.block)
        for block in self._extra_blocks.values():
            self.allocator.free(block)
        self.live.clear()
        self._extra_blocks.clear()

    # ------------------------------------------------------------------ placement rule
    def _factory_on_gpu(self) -> bool:
        """Where an op without tensor inputs puts its result: on the GPU in backward, or when
        the enclosing torch function was called with GPU tensors (library code asking
        ``x.device`` inside it sees the real CPU device)."""
        if self._backward_depth:
            return True
        if self._call_gpu is None:
            self._call_gpu = False
            if self._call_args:
                for x in self._call_args:
                    for t in _tensors_in(x):
                        if t.untyped_storage()._cdata in self.live:
                            self._call_gpu = True
                            return True
        return self._call_gpu

    # ------------------------------------------------------------------ hooks
    def _forward_pre(self, module: torch.nn.Module, args: Any) -> None:
        if not self._module_stack and not self._backward_depth and self.phase != "optimizer":
            self._root_forward(module)
        name = self._names.get(module)
        self._module_stack.append(name if name is not None else type(module).__name__)
        self._mark_module_seq()

    def _forward_post(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        if self._module_stack:
            self._module_stack.pop()
            self._mark_module_seq()

    def _mark_module_seq(self) -> None:
        if self._backward_depth or not torch.is_grad_enabled():
            return  # no nodes (no_grad), or a recomputation in backward whose nodes die in it
        seq = torch.autograd._get_sequence_nr()
        path = self._module_stack[-1] if self._module_stack else ""
        if self._seq_bounds and self._seq_bounds[-1] == seq:
            self._seq_paths[-1] = path
        else:
            self._seq_bounds.append(seq)
            self._seq_paths.append(path)

    def _root_forward(self, module: torch.nn.Module) -> None:
        if module not in self._names:
            label = self._root_labels.get(id(module), type(module).__name__)
            for name, m in module.named_modules():
                if m not in self._names:
                    self._names[m] = name or label
            self._roots.add(module)
        if self.iteration < 0 or self._stepped or (self._backward_done and not self._optimizers):
            self._new_iteration()
        self.set_phase("forward")
        self.classify_modules([module])

    def _optimizer_init(self) -> Callable[..., None]:
        """``Optimizer.__init__`` that tells the tracer an optimizer exists (iterations then
        run from optimizer step to optimizer step, also under gradient accumulation)."""
        orig = torch.optim.Optimizer.__init__
        optimizers = self._optimizers

        def __init__(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            orig(opt, *args, **kwargs)
            optimizers.add(opt)

        return __init__

    def _optimizer_pre(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._optimizers.add(opt)
        self.set_phase("optimizer")
        self.classify_optimizer(opt)

    def _optimizer_post(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.classify_optimizer(opt)
        self._stepped = True
        self.set_phase("other")

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if self.phase == "forward":
            self._upgrade(t, "activation")
        return t

    @contextlib.contextmanager
    def backward_phase(self) -> Iterator[None]:
        self._backward_depth += 1
        self.set_phase("backward")
        try:
            yield
        finally:
            self._backward_depth -= 1
            if not self._backward_depth:
                self.classify_modules(list(self._roots))
                for opt in list(self._optimizers):
                    self.classify_optimizer(opt)
                self._seq_bounds.clear()
                self._seq_paths.clear()
                self._backward_done = True
                self.set_phase("other")

    # ------------------------------------------------------------------ running
    @contextlib.contextmanager
    def running(self) -> Iterator["Tracer"]:
        """Everything that makes the virtual device and the recording work, undone on exit."""
        import torch.nn.modules.module as module_mod
        import torch.optim.optimizer as optim_mod

        with contextlib.ExitStack() as stack:
            stack.callback(self._close)
            stack.enter_context(patched_cuda(self.vc))
            # torch warns about what is missing on this machine, not on the target GPU.
            stack.enter_context(warnings.catch_warnings())
            warnings.filterwarnings("ignore", message="PyTorch was compiled without cuDNN")
            warnings.filterwarnings("ignore", message="'pin_memory' argument is set as true but no accelerator")
            # oneDNN kernels are a CPU choice (e.g. the LSTM's mkldnn_rnn_layer allocates a
            # workspace of its own); without them real CPU execution takes the same generic
            # paths as fake tensors.
            stack.enter_context(_mkldnn_disabled())
            stack.enter_context(_patched_attr(torch.nn.Module, "_apply", _module_apply))
            # Worker processes would run the dataset outside the tracer's control (and fork
            # its modes): load in-process. torch.compile runs the code eagerly.
            stack.enter_context(_patched_attr(torch.utils.data.DataLoader, "_get_iterator", _in_process_iterator))
            stack.enter_context(_patched_attr(torch, "compile", _eager_compile))
            # Tensor.record_stream parses its argument as a C++ Stream before any mode sees it.
            stack.enter_context(_patched_attr(torch.Tensor, "record_stream", self._tensor_record_stream))
            if self.fake:
                # Fake parameters take the same optimizer implementation as real ones on a
                # GPU (foreach by default): torch checks ``type(p) in _foreach_supported_types``.
                import torch.utils._foreach_utils as foreach_utils
                from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

                for types_list in (optim_mod._foreach_supported_types, foreach_utils._foreach_supported_types):
                    stack.enter_context(_appended(types_list, FakeTensor))
                for name in _INIT_FUNCTIONS:
                    orig = getattr(torch.nn.init, name, None)
                    if orig is not None:
                        stack.enter_context(_patched_attr(torch.nn.init, name, _skip_init(orig)))
            stack.enter_context(module_mod.register_module_forward_pre_hook(self._forward_pre))
            stack.enter_context(module_mod.register_module_forward_hook(self._forward_post, always_call=True))
            stack.enter_context(_patched_attr(torch.optim.Optimizer, "__init__", self._optimizer_init()))
            stack.enter_context(optim_mod.register_optimizer_step_pre_hook(self._optimizer_pre))
            stack.enter_context(optim_mod.register_optimizer_step_post_hook(self._optimizer_post))
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack))
            if self.fake:
                # FakeTensorMode logs every failing meta kernel (a user's shape error) with a
                # traceback of its own; the error itself reaches the user's code.
                stack.enter_context(_logger_level("torch._subclasses.fake_tensor", logging.CRITICAL))
                fake_mode = stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
                self._fake_mode = fake_mode
                self.shadows = Shadows()
                stack.enter_context(_patched_attr(torch.nn.Parameter, "__new__", _fake_parameter_new(fake_mode)))
            stack.enter_context(_AllocMode(self))
            device_mode = _DeviceMode(self)
            if self.fake:
                stack.enter_context(_patched_attr(FakeTensor, "device", _fake_device_property(self, device_mode)))
            stack.enter_context(device_mode)
            # ``torch.set_default_device("cuda")`` in user code leaves a DeviceContext on the
            # mode stack: take it off while ours is still there (DeviceContext re-pushes the
            # modes above it when it leaves).
            stack.callback(_restore_default_device, torch.get_default_device())
            yield self

    def _close(self) -> None:
        if self._pending_frees and not self._busy:
            self._drain()
        self._closed = True
        self._module_stack.clear()

    def finish(self) -> list[TraceEvent]:
        """Give every free event the final category of its allocation."""
        allocs = {e.id: e for e in self.events if e.kind == ALLOC}
        for e in self.events:
            if e.kind == FREE:
                a = allocs.get(e.id)
                if a is not None:
                    e.category = a.category
        return self.events


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


# --------------------------------------------------------------------------- patches
@contextlib.contextmanager
def _patched_attr(obj: Any, name: str, value: Any) -> Iterator[None]:
    had = name in vars(obj)
    old = vars(obj).get(name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if had:
            setattr(obj, name, old)
        else:
            delattr(obj, name)


def _restore_default_device(device: torch.device) -> None:
    if torch.get_default_device() != device:
        torch.set_default_device(device if device.type != "cpu" else None)


@contextlib.contextmanager
def _logger_level(name: str, level: int) -> Iterator[None]:
    logger = logging.getLogger(name)
    old = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(old)


@contextlib.contextmanager
def _mkldnn_disabled() -> Iterator[None]:
    was = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(was)


@contextlib.contextmanager
def _appended(items: list, item: Any) -> Iterator[None]:
    added = item not in items
    if added:
        items.append(item)
    try:
        yield
    finally:
        if added and item in items:
            items.remove(item)


def _fake_device_property(tracer: Tracer, mode: TorchFunctionMode) -> property:
    """``FakeTensor.device`` is a Python property, invisible to TorchFunctionMode: report
    ``cuda:0`` for GPU storages, but only to code running under the device mode (user and
    library Python code), never to FakeTensorMode's own kernels."""
    from torch._subclasses.fake_tensor import FakeTensor

    orig = vars(FakeTensor)["device"]

    def device(t: torch.Tensor) -> torch.device:
        d = orig.fget(t)
        if d.type == "cpu" and t.untyped_storage()._cdata in tracer.live:
            n = torch._C._len_torch_function_stack()
            for i in range(n - 1, -1, -1):
                if torch._C._get_function_stack_at(i) is mode:
                    return _CUDA
        return d

    return property(device, orig.fset)


def _module_apply(self: torch.nn.Module, fn: Callable, recurse: bool = True) -> torch.nn.Module:
    """``nn.Module._apply`` with the CPU semantics (rebind ``param.data``) for fake tensors too.

    PyTorch swaps fake parameters with ``torch.utils.swap_tensors``, which refuses tensors
    that carry weakrefs (fake tensors do); a module moved to the virtual GPU keeps its
    Parameter objects, as it does on a real GPU.
    """
    fake_type = _loaded_fake_tensor_type()

    def same_kind(a: torch.Tensor, b: torch.Tensor) -> bool:
        if not torch._has_compatible_shallow_copy_type(a, b):
            return False
        return fake_type is None or isinstance(a, fake_type) == isinstance(b, fake_type)

    if recurse:
        for module in self.children():
            module._apply(fn)
    for key, param in self._parameters.items():
        if param is None:
            continue
        with torch.no_grad():
            applied = fn(param)
        grad = param.grad
        if applied is not param:
            if same_kind(param, applied):
                param.data = applied
                out = param
            else:
                out = torch.nn.Parameter(applied, param.requires_grad)
                self._parameters[key] = out
        else:
            out = param
        if grad is not None:
            with torch.no_grad():
                grad_applied = fn(grad)
            if grad_applied is not grad:
                if same_kind(grad, grad_applied) and out is param:
                    out.grad.data = grad_applied  # type: ignore[union-attr]
                else:
                    out.grad = grad_applied.requires_grad_(grad.requires_grad)
    for key, buf in self._buffers.items():
        if buf is not None:
            self._buffers[key] = fn(buf)
    return self


def _in_process_iterator(loader: Any) -> Any:
    """``DataLoader._get_iterator`` with ``num_workers=0`` whatever was asked."""
    from torch.utils.data.dataloader import _SingleProcessDataLoaderIter

    workers = loader.num_workers
    loader.num_workers = 0
    try:
        return _SingleProcessDataLoaderIter(loader)
    finally:
        loader.num_workers = workers


def _eager_compile(model: Any = None, **kwargs: Any) -> Any:
    """``torch.compile`` under the tracer: the model (or function) itself, run eagerly."""
    if model is None:
        return lambda m: m
    return model


def _fake_parameter_new(fake_mode: Any) -> Callable:
    """Fake mode: every ``nn.Parameter`` holds a fake tensor, whatever its size, so that model
    weights never take host memory and keep their identity when moved to the GPU."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import _disable_current_modes

    orig_new = torch.nn.Parameter.__new__

    def __new__(cls: type, data: torch.Tensor | None = None, requires_grad: bool = True) -> torch.Tensor:
        if isinstance(data, torch.Tensor) and not isinstance(data, FakeTensor):
            with _disable_current_modes():
                data = fake_mode.from_tensor(data)
        return orig_new(cls, data, requires_grad)

    return __new__


_INIT_FUNCTIONS = (
    "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
    "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_",
)


def _skip_init(orig: Callable) -> Callable:
    """Fake mode: weight initialisers leave fake tensors as they are - values do not matter
    for memory, and some initialisers read values (``trunc_normal_`` loops on ``mask.any()``)."""
    from torch._subclasses.fake_tensor import FakeTensor

    def init(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if isinstance(tensor, FakeTensor):
            return tensor
        return orig(tensor, *args, **kwargs)

    init.__name__ = orig.__name__
    init.__doc__ = orig.__doc__
    init.__wrapped__ = orig  # type: ignore[attr-defined]
    return init


# --------------------------------------------------------------------------- dispatch mode
def _fake_exceptions() -> tuple[type[BaseException], ...]:
    from torch._subclasses import fake_tensor as ft

    excs: list[type[BaseException]] = [
        ft.DataDependentOutputException,
        ft.DynamicOutputShapeException,
        ft.UnsupportedOperatorException,
        ft.UnsupportedFakeTensorException,
    ]
    try:
        from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

        excs.append(GuardOnDataDependentSymNode)
    except ImportError:  # pragma: no cover
        pass
    return tuple(excs)


_PRIM_DEVICE = torch.ops.prim.device.default


def _is_mutable(func: Any) -> bool:
    schema = getattr(func, "_schema", None)
    return bool(schema is not None and schema.is_mutable)


def _loaded_fake_tensor_type() -> type | None:
    """FakeTensor if fake tensors are in use (importing them costs seconds: torch._dynamo)."""
    mod = sys.modules.get("torch._subclasses.fake_tensor")
    return getattr(mod, "FakeTensor", None) if mod is not None else None


# Fake mode: host tensors up to this size made by factories are real (see _run_on_host).
HOST_REAL_BYTES = 16 * 1024 * 1024


def _factory_numel(args: tuple) -> int | None:
    """Elements a factory makes, from its first size argument (``empty(size)``,
    ``randint(high, size)``, ...); None if it has none (``arange``, ``randperm``)."""
    for a in args:
        if isinstance(a, (list, tuple)) and all(type(d) is int for d in a):
            n = 1
            for d in a:
                n *= d
            return n
    return None


def _has_fake_tensor(args: tuple) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor  # cached import

    for a in args:
        if isinstance(a, FakeTensor):
            return True
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, FakeTensor):
                    return True
    return False


def _has_tensor(args: tuple) -> bool:
    for a in args:
        if isinstance(a, torch.Tensor):
            return True
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor):
                    return True
    return False


class _AllocMode(TorchDispatchMode):
    """Sees every aten op; turns new GPU storages into ``alloc`` events."""

    def __init__(self, tracer: Tracer):
        super().__init__()
        self.t = tracer
        self.fake_errors = _fake_exceptions() if tracer.fake else ()
        self.mutable: dict[Any, bool] = {}
        self.backward_writes = BackwardInPlace()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is _PRIM_DEVICE and self.fake_errors:
            # C++ asks every fake tensor for its device (autograd does so per input): answer
            # from the tensor without a round trip through FakeTensorMode.
            dev = getattr(args[0], "fake_device", None)
            if dev is not None:
                return dev
        kwargs = kwargs or {}
        tr = self.t
        in_backward = tr.phase == "backward" and self.backward_writes.node_changed() is not None
        if in_backward:  # gradient sums and scatters in place, as on a GPU (grad_accumulation.py)
            func, args, kwargs = self.backward_writes.rewrite(func, args, kwargs) or (func, args, kwargs)
        if tr.user_state is not None and tr.user_state.storages:
            mutable = self.mutable.get(func)
            if mutable is None:
                mutable = self.mutable[func] = _is_mutable(func)
            if mutable:  # copy-on-write of the user's tensors, put back when tracing ends
                for t in _tensors_in(args):
                    tr.user_state.before_write(t)
                for t in _tensors_in(tuple(kwargs.values())):
                    tr.user_state.before_write(t)
        if self.fake_errors:
            if tr._target != "gpu" and not _has_fake_tensor(args) and not (kwargs and _has_fake_tensor(tuple(kwargs.values()))):
                factory = not _has_tensor(args) and not (kwargs and _has_tensor(tuple(kwargs.values())))
                if not factory or not tr._factory_on_gpu():
                    return self._run_on_host(func, args, kwargs, factory)
            fast = FAST_FAKE.get(func)
            out = fast(*args, **kwargs) if fast is not None else NotImplemented
            if out is NotImplemented:
                try:
                    out = func(*args, **kwargs)
                except self.fake_errors as e:
                    # values the fake tensors lack: known ones come from the shadows
                    out = tr.shadows.data_dependent(func, args, kwargs, tr._fake_mode)
                    if out is NotImplemented:
                        raise _NeedsRealValues(str(func), _fake_reason(e), _user_frame(2)) from e
                else:
                    tr.shadows.after_op(func, args, kwargs, out)
            else:
                tr.shadows.after_op(func, args, kwargs, out)
        else:
            out = func(*args, **kwargs)
        live = tr.live
        gpu: bool | None = None
        for t in _tensors_in(out):
            st = t.untyped_storage()
            key = st._cdata
            rec = live.get(key)
            nbytes = st.nbytes()
            if rec is not None:
                if rec.nbytes != nbytes:
                    tr._resized(func, t, st, key, nbytes)
                continue
            if gpu is None:
                gpu = self._on_gpu(args, kwargs)
            if gpu:
                tr._on_new_storage(func, t, st, key, nbytes)
        if in_backward:
            self.backward_writes.made(_tensors_in(out))
        if tr.op_hooks:
            for hook in tr.op_hooks:
                hook(tr, func, args, kwargs, out)
        return out

    def _run_on_host(self, func: Any, args: tuple, kwargs: dict, factory: bool) -> Any:
        """Fake mode, CPU-side work on real tensors: run it for real, so data loading, samplers
        and host-side logic see real values. A host factory runs fake first to learn its size:
        a big one (a weight matrix before ``.cuda()``) stays fake, so that building a large
        model costs no host memory."""
        numel = _factory_numel(args) if factory else None
        if factory and (numel is None or numel * 8 > HOST_REAL_BYTES):
            try:
                trial = func(*args, **kwargs)
            except self.fake_errors as e:
                raise _NeedsRealValues(str(func), _fake_reason(e), _user_frame(2)) from e
            if sum(t.untyped_storage().nbytes() for t in _tensors_in(trial)) > HOST_REAL_BYTES:
                return trial
            del trial
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            return func(*args, **kwargs)

    def _on_gpu(self, args: tuple, kwargs: dict) -> bool:
        tr = self.t
        if tr._target is not None:
            return tr._target == "gpu"
        live = tr.live
        found = False
        for x in (args, tuple(kwargs.values())):
            for t in _tensors_in(x):
                found = True
                if t.untyped_storage()._cdata in live:
                    return True
        return False if found else tr._factory_on_gpu()


def _fake_reason(e: BaseException) -> str:
    name = type(e).__name__
    if name == "DynamicOutputShapeException":
        return "its output shape depends on tensor values"
    if name in ("DataDependentOutputException", "GuardOnDataDependentSymNode"):
        return "it reads tensor values"
    return f"fake tensors do not support it ({name})"


# --------------------------------------------------------------------------- device mode
_device_constructors = _device_mod._device_constructors
_CUDA = torch.device("cuda", 0)
_CPU = torch.device("cpu")
_T = torch.Tensor


def _as_device(d: Any) -> torch.device | None:
    if d is None:
        return None
    if isinstance(d, torch.device):
        return d
    if isinstance(d, int):
        return torch.device("cuda", d)
    if isinstance(d, str):
        return torch.device(d)
    return None


class _DeviceMode(TorchFunctionMode):
    """The virtual CUDA device at the Python API: device arguments, transfers, queries."""

    def __init__(self, tracer: Tracer):
        super().__init__()
        self.t = tracer
        self.special: dict[Any, Callable] = {
            _T.device.__get__: self._device,
            _T.is_cuda.__get__: lambda f, a, k: self.t.is_gpu(a[0]),
            _T.is_cpu.__get__: lambda f, a, k: not self.t.is_gpu(a[0]),
            _T.get_device: lambda f, a, k: 0 if self.t.is_gpu(a[0]) else -1,
            _T.to: self._to,
            _T.cuda: self._cuda,
            _T.cpu: self._cpu,
            _T.pin_memory: lambda f, a, k: a[0],
            _T.is_pinned: lambda f, a, k: False,
            _T.numpy: self._numpy,
            _T.backward: self._backward,
            torch.autograd.backward: self._backward,
            torch.autograd.grad: self._backward,
            torch.nn.functional.dropout: self._dropout,
            torch.dropout: self._dropout,
            # SDPA as the target GPU's backend (flash / efficient / cuDNN / math) allocates.
            torch.nn.functional.scaled_dot_product_attention: sdpa.tracer_handler(tracer),
        }
        if tracer.fake:
            self.special.update({
                _T.item: self._item,
                _T.__float__: self._item,
                _T.__format__: self._format,
                _T.__bool__: self._needs_value,
                _T.__int__: self._needs_value,
                _T.__index__: self._needs_value,
                _T.tolist: self._needs_value,
                _T.__deepcopy__: self._deepcopy,
            })

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        h = self.special.get(func)
        if h is not None:
            return h(func, args, kwargs)
        tr = self.t
        dev = kwargs.get("device")
        if dev is None and _device_mod.CURRENT_DEVICE is not None and func in _device_constructors():
            # ``with torch.device("cuda")`` / ``set_default_device``: the DeviceContext sits
            # below this mode and would make a real CUDA tensor; place it here instead.
            dev = _device_mod.CURRENT_DEVICE
        target = None
        if dev is not None:
            d = _as_device(dev)
            if d is not None and d.type in ("cuda", "cpu"):
                kwargs = dict(kwargs)
                kwargs["device"] = _CPU
                target = "gpu" if d.type == "cuda" else "host"
        saved = (tr._target, tr._explicit, tr._call_args, tr._call_gpu)
        tr._target, tr._explicit, tr._call_args, tr._call_gpu = target, target == "gpu", args, None
        try:
            out = func(*args, **kwargs)
        finally:
            tr._target, tr._explicit, tr._call_args, tr._call_gpu = saved
        return out

    # -- kernels that differ between the CPU and CUDA
    def _dropout(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Dropout as CUDA runs it: the fused kernel, which saves a bool mask for backward.
        The CPU kernel multiplies by a noise tensor of the input's dtype instead (a mask 4x
        larger for float32), which would inflate every dropout layer's saved activations."""
        names = ("input", "p", "training", "inplace") if func is torch.nn.functional.dropout else ("input", "p", "train")
        bound = dict(zip(names, args), **kwargs)
        x = bound["input"]
        p = bound.get("p", 0.5)
        training = bound.get("training", bound.get("train", True))
        if isinstance(x, torch.Tensor) and self.t.is_gpu(x) and training and 0.0 < p < 1.0 and x.numel() > 0:
            out = torch.native_dropout(x, p, True)[0]
            return x.copy_(out) if bound.get("inplace", False) else out
        return func(*args, **kwargs)

    # -- device queries
    def _device(self, func: Any, args: tuple, kwargs: dict) -> torch.device:
        return _CUDA if self.t.is_gpu(args[0]) else func(*args, **kwargs)

    # -- transfers
    def _transfer(self, t: torch.Tensor, to_gpu: bool, dtype: Any, non_blocking: bool, memory_format: Any,
                  copy: bool) -> torch.Tensor:
        """``.to`` / ``.cuda()`` / ``.cpu()``: a copy when the (virtual) device changes, else
        PyTorch's own rules (no copy unless dtype or memory format change, or ``copy=True``)."""
        tr = self.t
        src_gpu = tr.is_gpu(t)
        mf = memory_format if memory_format is not None else torch.preserve_format
        if src_gpu == to_gpu:
            return t.to(dtype=dtype if dtype is not None else t.dtype, non_blocking=non_blocking, copy=copy,
                        memory_format=mf)
        saved = (tr._target, tr._explicit)
        tr._target, tr._explicit = ("gpu" if to_gpu else "host"), (to_gpu and not src_gpu)
        try:
            return t.to(device=_CPU, dtype=dtype, non_blocking=non_blocking, copy=True, memory_format=mf)
        finally:
            tr._target, tr._explicit = saved

    def _to(self, func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
        t, rest = args[0], args[1:]
        kwargs = dict(kwargs)
        copy = bool(kwargs.pop("copy", False))
        if len(rest) >= 4 and not isinstance(rest[0], torch.Tensor):  # to(device, dtype, non_blocking, copy)
            copy = copy or bool(rest[3])
            rest = rest[:3]
        elif len(rest) >= 3 and isinstance(rest[0], torch.dtype):  # to(dtype, non_blocking, copy)
            copy = copy or bool(rest[2])
            rest = rest[:2]
        if rest and isinstance(rest[0], torch.Tensor):
            other = rest[0]
            device = _CUDA if self.t.is_gpu(other) else other.device
            dtype = other.dtype
            non_blocking = bool(rest[1]) if len(rest) > 1 else kwargs.get("non_blocking", False)
            memory_format = kwargs.get("memory_format")
        else:
            device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*rest, **kwargs)
        if device is None or device.type not in ("cuda", "cpu"):
            if device is None:
                return self._transfer(t, self.t.is_gpu(t), dtype, non_blocking, memory_format, copy)
            return func(*args, **kwargs)
        return self._transfer(t, device.type == "cuda", dtype, non_blocking, memory_format, copy)

    def _cuda(self, func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
        non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
        return self._transfer(args[0], True, None, non_blocking, kwargs.get("memory_format"), False)

    def _cpu(self, func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
        return self._transfer(args[0], False, None, False, kwargs.get("memory_format"), False)

    def _numpy(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if self.t.is_gpu(args[0]):
            raise TypeError(
                "can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first."
            )
        if self.t.fake:
            raise _NeedsRealValues("Tensor.numpy()", "numpy needs the tensor's values", _user_frame(3))
        return func(*args, **kwargs)

    # -- phases
    def _backward(self, func: Any, args: tuple, kwargs: dict) -> Any:
        with self.t.backward_phase():
            return func(*args, **kwargs)

    # -- values (fake mode)
    def _item(self, func: Any, args: tuple, kwargs: dict) -> Any:
        try:
            return func(*args, **kwargs)
        except _NeedsRealValues:
            return _placeholder(args[0].dtype)

    def _format(self, func: Any, args: tuple, kwargs: dict) -> str:
        t = args[0]
        if t.dim() != 0:
            return func(*args, **kwargs)
        try:
            value = t.item()
        except _NeedsRealValues:
            value = _placeholder(t.dtype)
        return format(value, *args[1:], **kwargs)

    def _deepcopy(self, func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
        """``copy.deepcopy`` of a fake tensor (``nn.TransformerEncoder`` clones its layer):
        torch's storage-level copy leaves fake tensors whose views get storages of their
        own; a clone is the same allocation with sane aliasing."""
        from torch._subclasses.fake_tensor import FakeTensor

        t, memo = args[0], (args[1] if len(args) > 1 else kwargs.get("memo"))
        if not isinstance(t, FakeTensor) or memo is None:
            return func(*args, **kwargs)
        if id(t) in memo:
            return memo[id(t)]
        import copy

        with torch.no_grad():
            new = t.detach().clone(memory_format=torch.preserve_format)
        if isinstance(t, torch.nn.Parameter) or getattr(t, "_is_param", False):
            new = torch.nn.Parameter(new, t.requires_grad)
        elif t.requires_grad and t.is_leaf:
            new.requires_grad_(True)
        memo[id(t)] = new
        if t.grad is not None:
            new.grad = copy.deepcopy(t.grad, memo)
        for k, v in vars(t).items():
            if not hasattr(new, k):
                setattr(new, k, copy.deepcopy(v, memo))
        return new

    def _needs_value(self, func: Any, args: tuple, kwargs: dict) -> Any:
        try:
            return func(*args, **kwargs)
        except _NeedsRealValues as e:
            name = getattr(func, "__name__", str(func))
            raise _NeedsRealValues(f"Tensor.{name}", "a tensor value decides control flow or a shape",
                                   _user_frame(3) or e.where) from None


# --------------------------------------------------------------------------- entry points
def trace(
    code: Callable[[], Any] | str | types.CodeType,
    namespace: dict | None = None,
    *,
    mode: str = "auto",
    allocator: Any = None,
    device: dict | None = None,
    filename: str = "<cell>",
    setup: Iterable[Callable[[Tracer], Any]] = (),
    max_iterations: int | None = None,
) -> Trace:
    """Run ``code`` (a no-argument callable, or source text / a compiled code object executed
    in a copy of ``namespace``) as if on a CUDA GPU; return the trace of its GPU memory requests.

    ``mode``: "fake" (FakeTensorMode), "real" (real CPU tensors) or "auto" (fake, then real
    if the code needs tensor values; ``trace.meta["fallback"]`` says why). ``allocator``:
    the simulated caching allocator that answers ``torch.cuda.memory_*`` (a fresh
    ``CachingAllocator`` if None). ``device``: the target GPU's properties (see
    ``virtual_cuda.DEFAULT_DEVICE``). ``setup``: callables given the :class:`Tracer` before
    the code runs (to add op hooks or events); ``sys.exit(0)`` in the code ends it normally.
    ``max_iterations``: stop the code when
    iteration ``max_iterations`` would start (``trace.meta["stopped"]`` is then True): a
    long training loop costs only the iterations that show its steady state.

    ``trace.meta``: ``device`` (the target GPU's name), ``iterations`` (how many started),
    ``stopped`` (``max_iterations`` cut the code short), ``fallback`` (auto mode only: why
    fake mode gave way to real mode). Tracing patches process-wide torch attributes for its
    duration: do not run other torch code in other threads meanwhile. Exceptions of the user's code propagate
    unchanged, with the traceback starting at the user's code.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if max_iterations is not None and max_iterations < 1:
        raise ValueError(f"max_iterations must be at least 1, not {max_iterations}")
    if isinstance(code, str):
        compiled = compile(code, filename, "exec", dont_inherit=True)
        if filename.startswith("<"):
            linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        code = compiled
    elif not isinstance(code, types.CodeType) and not callable(code):
        raise TypeError(f"code must be a callable or source text, not {type(code).__name__}")
    try:
        return _trace_modes(code, namespace, mode, allocator, device, setup, max_iterations)
    except BaseException as e:
        if not _trim_traceback(e):
            raise
        unsupported = _needs_real_gpu(e, mode)
        if unsupported is not None:
            raise unsupported from e
        raise e  # the user's exception, its traceback starting at the user's code


def _trace_modes(code: Any, namespace: dict | None, mode: str, allocator: Any, device: dict | None,
                 setup: Iterable[Callable[[Tracer], Any]], max_iterations: int | None) -> Trace:
    setup = list(setup)
    attempts = ["fake", "real"] if mode == "auto" else [mode]
    fallback = ""
    for attempt in attempts:
        try:
            tr = _trace_once(code, namespace, attempt, allocator, device, setup, max_iterations)
        except _NeedsRealValues as e:
            if attempt == "fake" and mode == "auto":
                at = f" at {e.where}" if e.where else ""
                fallback = f"fake mode cannot run {e.op}{at} ({e.reason}); traced in real mode"
                if allocator is not None:  # the aborted attempt's blocks are back; forget its peaks
                    allocator.reset_peak_stats()
                    getattr(allocator, "reset_accumulated_stats", lambda: None)()
                continue
            raise UnsupportedOpError(e.op, attempt, e.reason, e.where) from None
        if fallback:
            tr.meta["fallback"] = fallback
        return tr
    raise AssertionError("unreachable")  # pragma: no cover


def _user_roots(code: Any, namespace: dict | None) -> list[Any]:
    """The objects traced code can reach that belong to the user."""
    roots: list[Any] = []
    if namespace is not None:
        roots.extend(v for k, v in namespace.items() if not k.startswith("__"))
    fn = code
    if isinstance(code, types.MethodType):
        roots.append(code.__self__)
        fn = code.__func__
    if isinstance(fn, types.FunctionType):
        g = fn.__globals__
        roots.extend(g[n] for n in fn.__code__.co_names if n in g)
        roots.extend(c.cell_contents for c in (fn.__closure__ or ()) if _cell_has(c))
        roots.extend(fn.__defaults__ or ())
    elif callable(code) and not isinstance(code, types.CodeType):
        roots.append(code)
    return roots


def _cell_has(c: types.CellType) -> bool:
    try:
        c.cell_contents
    except ValueError:
        return False
    return True


_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def _is_plain(v: Any, depth: int = 0) -> bool:
    if type(v) in _PLAIN:
        return True
    if depth > 4:
        return False
    if type(v) in (list, tuple, set, frozenset):
        return len(v) <= 100_000 and all(_is_plain(x, depth + 1) for x in v)
    if type(v) is dict:
        return len(v) <= 100_000 and all(_is_plain(k, depth + 1) and _is_plain(x, depth + 1) for k, x in v.items())
    return False


def _trace_once(code: Any, namespace: dict | None, mode: str, allocator: Any, device: dict | None,
                setup: list[Callable[[Tracer], Any]], max_iterations: int | None) -> Trace:
    tracer = Tracer(mode, allocator, device, max_iterations)
    for fn in setup:
        fn(tracer)
    is_source = isinstance(code, types.CodeType)
    scratch: dict | None = None
    if is_source:
        scratch = dict(namespace or {})
        scratch.setdefault("__name__", "__main__")
        scratch.setdefault("__builtins__", builtins)
    state = UserState.capture(_user_roots(code, namespace))
    tracer.user_state = state
    persist: dict[str, Any] = {}
    start = time.perf_counter()
    ok = False
    # Objects that exist now cannot become garbage of the traced code: leave them out of
    # the collections (torch's own modules make a full collection cost a quarter second).
    gc.freeze()
    try:
        with tracer.running():
            for label_src in (namespace or {}, getattr(code, "__globals__", {}) or {}):
                for k, v in label_src.items():
                    if isinstance(v, torch.nn.Module):
                        tracer.register_root(v, k)
                    elif isinstance(v, torch.optim.Optimizer):
                        tracer._optimizers.add(v)
            if scratch is not None:
                for k, v in scratch.items():
                    if isinstance(v, torch.nn.Module):
                        tracer.register_root(v, k)
            try:
                _run_user_code(code, scratch)
            except _StopTracing:
                pass
            except SystemExit as e:  # ``sys.exit(main())`` at the end of a script
                if e.code not in (None, 0):
                    raise
            if scratch is not None:
                _classify_leftovers(tracer, scratch.values())
                persist = {
                    k: v for k, v in scratch.items()
                    if not k.startswith("__") and _is_plain(v) and (namespace is None or namespace.get(k, _NO) is not v)
                }
                scratch.clear()
                scratch = None
            gc.collect()
        ok = True
    finally:
        gc.unfreeze()
        seconds = time.perf_counter() - start
        if not ok:
            tracer.release_all()
            scratch = None
        state.restore()
    if namespace is not None:
        namespace.update(persist)
    events = tracer.finish()
    props = tracer.vc.props
    meta = {"device": props.name, "compute_capability": [props.major, props.minor],
            "iterations": tracer.iteration + 1, "stopped": tracer.stopped,
            "convolutions": runs_convolutions(events)}  # read on every GPU switch: found once
    if tracer.sdpa_calls:
        meta["sdpa_calls"] = tracer.sdpa_calls  # their backend was chosen for this capability
    return Trace(events=events, mode=mode, seconds=seconds, meta=meta)


_NO = object()


def _run_user_code(code: Any, scratch: dict | None) -> None:
    """The one frame between the tracer and the user's code (tracebacks start after it)."""
    if scratch is not None:
        exec(code, scratch)
    else:
        code()


def _classify_leftovers(tracer: Tracer, values: Iterable[Any]) -> None:
    """Name and classify what the code leaves behind (a model built but never run)."""
    for v in values:
        if isinstance(v, torch.nn.Module):
            tracer.classify_modules([v])
        elif isinstance(v, torch.optim.Optimizer):
            tracer.classify_optimizer(v)


_NO_CUDA_MESSAGES = ("not compiled with CUDA", "not linked with support for cuda", "no NVIDIA driver",
                     "hasPrimaryContext", "CUDA driver", "cuda runtime", "ATen_cuda", "CUDA build")


def _needs_real_gpu(e: BaseException, mode: str) -> UnsupportedOpError | None:
    """A failure of this machine's missing GPU rather than of the user's code: name the
    torch function the user's code called that needs it."""
    msg = str(e)
    if not isinstance(e, (RuntimeError, AssertionError)) or not any(m.lower() in msg.lower() for m in _NO_CUDA_MESSAGES):
        return None
    op, where = "a CUDA-only call", ""
    tb = e.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if _is_user_file(code.co_filename):
            where = f"{code.co_filename}:{tb.tb_lineno}"
        elif where:
            module = tb.tb_frame.f_globals.get("__name__", "")
            op = f"{module}.{code.co_name}" if module else code.co_name
            break
        tb = tb.tb_next
    return UnsupportedOpError(op, mode, msg.splitlines()[0] if msg else "", where,
                              hint="it needs a real GPU, which the virtual device does not emulate; "
                              "remove the call from the traced code")


_XMEM_DIR = os.path.dirname(__file__) + os.sep
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _trim_traceback(e: BaseException) -> bool:
    """Show the user's code, not the tracer: the traceback starts where the user's code was
    entered (the frame after :func:`_run_user_code`), and when the error was raised inside
    torch below one of the tracer's modes it ends where the user's (or a library's) code
    called into the tracer - as on a GPU, where the op raises from C++. An error raised by
    the tracer's own code keeps its frames. False if the error did not come from user code."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code is not _run_user_code.__code__:
        tb = tb.tb_next
    if tb is None:
        return False
    start = tb.tb_next
    if start is None:
        return True
    e.__traceback__ = start
    frames = []
    t = start
    while t is not None:
        frames.append(t)
        t = t.tb_next
    if frames[-1].tb_frame.f_code.co_filename.startswith(_TORCH_DIR):
        for prev, cur in zip(frames, frames[1:]):
            if cur.tb_frame.f_code.co_filename.startswith(_XMEM_DIR):
                prev.tb_next = None
                break
    return True


def user_traceback_lines(e: BaseException) -> list[str]:
    """The traceback of an exception re-raised by :func:`trace`, from the user's code on."""
    import traceback

    tb = e.__traceback__
    t = tb
    while t is not None:
        if t.tb_frame.f_code in (trace.__code__, _run_user_code.__code__) and t.tb_next is not None:
            tb = t.tb_next
            break
        t = t.tb_next
    return traceback.format_exception(type(e), e, tb)


__all__ = [
    "MODES",
    "Tracer",
    "TracerError",
    "UnsupportedOpError",
    "trace",
    "user_traceback_lines",
]


