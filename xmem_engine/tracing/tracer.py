"""The Tracer: the record of one run of user code on the virtual GPU.

It holds what the run has done so far: the live GPU storages (each an ``alloc`` event and
the simulated allocator's block), the events in order, the module running, the phase and
the iteration. The modes (``alloc_mode.py``, ``device_mode.py``) tell it about storages
and calls; its own hooks (:meth:`Tracer.hooks`) tell it about modules, optimizers and
tensors saved for backward. ``run.py`` puts it all together; see ``tracing/__init__.py``
for how tracing works as a whole.

Categories and phases
---------------------
Autograd's saved-tensor hooks tell which storages are saved for backward (``activation``);
parameters, buffers, gradients and optimizer state are recognised from the modules and
optimizers the code uses, and a storage's category only moves up (``_RANK``), so the last
word is the most specific one. ``forward`` starts at the forward pre-hook of a top-level
module (one called while no other module runs), or at a compiled graph that trains
parameters run outside one, and lasts until a backward starts; ``backward`` lasts while autograd's engine
runs; ``optimizer`` while ``Optimizer.step`` runs, except inside the closure passed to it
(LBFGS, Lightning's automatic optimization), whose forward and backward are phases as they
are outside; everything else is ``other``. Iteration 0 starts at the first forward; a new
one at the first forward after an optimizer step (with gradient accumulation, an iteration
holds all the micro-batches of one step), or, while the code has created no optimizer,
after a backward. Events before the first forward (model construction, ``.to("cuda")``)
carry iteration -1.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import weakref
from typing import Any, Callable, Iterable, Iterator

import torch
from torch.nn.parameter import UninitializedTensorMixin
from torch.utils.weak import WeakIdKeyDictionary

from xmem_engine.simulation.allocator import CachingAllocator
from xmem_engine.trace import ALLOC, EMPTY_CACHE, FREE, ITERATION, PHASE, RECORD_STREAM, RESET_PEAK, Category, Phase, TraceEvent
from xmem_engine.tracing.errors import StopTracing
from xmem_engine.tracing.frames import as_torch_error, op_name, user_frame
from xmem_engine.tracing.patches import labelling_grad_hooks, patched_attr
from xmem_engine.tracing.scope import CallScope
from xmem_engine.tracing.storages import STORAGE_RESIZE, LiveStorage, ResizedBytes
from xmem_engine.tracing.symbolic import hint
from xmem_engine.tracing.kernels.cuda_temporaries import device_of
from xmem_engine.tracing.shims.distributed import World
from xmem_engine.tracing.fake.guesses import Guesses
from xmem_engine.tracing.host_memory import HostBudget
from xmem_engine.tracing.fake.shadow_values import Shadows
from xmem_engine.tracing.shims.subclasses import inner_tensors, is_wrapper, storage_key, tensors_in
from xmem_engine.tracing.user_state import UserState
from xmem_engine.tracing.virtual_cuda import VirtualCuda, VirtualStream

_NO_SEQUENCE_NR = 2**63  # AccumulateGrad and other nodes outside the forward's numbering

# Category precedence: a storage's category only moves up (a parameter stays a parameter
# even when it is also saved for backward).
_RANK = {Category.OTHER: 0, Category.TEMPORARY: 1, Category.ACTIVATION: 2, Category.WORKSPACE: 3, Category.INPUT: 3,
         Category.COMMUNICATION: 4,  # a DDP bucket whose views are the gradients is a gradient
         Category.GRADIENT: 5, Category.OPTIMIZER_STATE: 5, Category.PARAMETER: 6, Category.BUFFER: 6}


class Tracer:
    """Records one run of user code. Use :func:`trace` / :func:`trace_script` rather than this."""

    def __init__(self, mode: str, allocator: Any = None, device: dict | None = None,
                 max_iterations: int | None = None, world: World | None = None):
        if mode not in ("fake", "real"):
            raise ValueError(f"mode must be 'fake' or 'real', not {mode!r}")
        self.world = world  # the distributed rank traced, when one was named (distributed.py)
        w = world or World()
        self.vc = VirtualCuda(self, device, index=w.local_rank, count=w.local_size)
        self.cuda_device = device_of(self.vc.props)  # the target GPU as cuda_temporaries' rules see it
        self.by_sm: list[list] = []  # see transients
        if allocator is None:
            # No capacity: the trace records every request; whether it fits is decided
            # downstream. device_total lets set_per_process_memory_fraction work.
            allocator = CachingAllocator(device_total=self.vc.props.total_memory)
        self.mode = mode
        self.fake = mode == "fake"
        # fake mode: real values of small GPU tensors whose contents are known (shadow_values.py)
        self.shadows: Shadows | None = None
        # fake mode: the values nobody knows, guessed (guesses.py)
        self.guesses: Guesses | None = None
        self.allocator = allocator
        self.events: list[TraceEvent] = []
        self.live: dict[int, LiveStorage] = {}
        self.phase = Phase.OTHER
        self.iteration = -1
        self.max_iterations = max_iterations
        self.stopped = False
        self.op_hooks: list[Callable[["Tracer", Any, tuple, dict, Any], None]] = []
        self.sdpa_calls = 0  # attention calls whose CUDA backend sdpa.py chose for this GPU
        self.conv_calls: list[list] = []  # GPU convolutions' cuDNN problems (convolutions.py)
        # GEMMs that wrote into a tensor they did not allocate (``mm(..., out=buf)``: Inductor's extern
        # kernels): [events before it, op, dtype, shape, phase, stream, module, source, iteration]
        self.gemm_into: list[list] = []
        self.repeat_span: tuple[int, int] | None = None  # the steady state's last pass, (first event, end) (steady.py)
        self.failed_tries: list[tuple[int, int]] = []  # out-of-memory tries' events (shims/batch_size_search.py)
        self.batch_searches: list[dict] = []  # each batch-size search's tries, as data (the same module)
        self.cudnn_benchmark = False  # one ran with torch.backends.cudnn.benchmark on
        self.notes: list[str] = []  # what the estimate should tell about how this run was traced
        self.torch_target: tuple[int, int] | None = None  # the GPU run's PyTorch, when not this one
        self.real_ops: dict[str, int] = {}  # fake mode: ops run for real (no fake kernel), by name
        self.managed_bytes = 0  # unified memory outside the caching allocator (bitsandbytes' paged optimizer states)
        # torch.compile (torch_compile.py): "inductor" compiles for the target GPU, "eager" runs
        # compiled code eagerly; ``in_dynamo`` while a compiled function is called (the traced
        # tensors report cuda to Dynamo), ``compiling`` while a compiler runs (the modes let its
        # ops through)
        self.compile_mode = "inductor"
        self.compiled: Any = None  # torch_compile.CompileRecord, while recording
        self.in_dynamo = self.compiling = False
        self.module_types: dict[str, str] = {}  # module path -> class name ("layers.0.mlp.fc1" -> "Linear")
        self._next_id = 0
        self._param_module = WeakIdKeyDictionary()  # parameter -> its module's path (weakly: no stale ids)
        self._module_stack: list[str] = []
        self._names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._roots: weakref.WeakSet = weakref.WeakSet()
        self._optimizers: weakref.WeakSet = weakref.WeakSet()
        self._root_labels = WeakIdKeyDictionary()  # root module -> its label
        # Module of each autograd node, by sequence number: the innermost module running
        # when sequence numbers from _seq_bounds[i] on were handed out is _seq_paths[i].
        self._seq_bounds: list[int] = []
        self._seq_paths: list[str] = []
        self._backward_depth = 0
        self._stepped = False
        self._backward_done = False
        self.scope = CallScope()  # the torch call now running (scope.py)
        self._busy = 0
        self._pending_frees: list[int] = []
        self._closed = False
        self._extra_blocks: dict[int, Any] = {}
        self.fake_mode: Any = None  # the FakeTensorMode, in fake mode
        self.symbolic: Any = None  # a symbolic.SymbolicBatch: the batch as a symbol (fake mode)
        self.device_mode: Any = None  # the DeviceMode (device_mode.py), while recording
        self.user_state: UserState | None = None  # copy-on-write of the user's tensors
        self.host_budget: HostBudget | None = None  # real mode: the host memory its real tensors may take (host_memory.py)
        self.live_bytes = 0  # bytes of GPU storages alive now, and the most at any time
        self.peak_live_bytes = 0

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
            self._extra_blocks[event.id] = self.allocator.malloc(hint(event.bytes), event.stream)
        elif event.kind == FREE and event.id in self._extra_blocks:
            self.allocator.free(self._extra_blocks.pop(event.id))
        self.events.append(event)
        return event

    def transients(self, func: Any, steps: Iterable[tuple[str, str, int]], plan_args: Any = None) -> None:
        """Buffers a CUDA kernel allocates and frees inside one op (``cuda_temporaries.py``):
        ``("alloc", slot, nbytes)`` / ``("free", slot, 0)`` steps, in the kernel's order. Sized by
        the GPU's SM count (``plan_args`` of a ``BySM``), they are also kept in ``by_sm``
        (``Trace.meta["by_sm"]``: start, count, plan) for an estimate for another GPU to resize."""
        self.labelled_transients(steps, op_name(func), self.current_module(), user_frame(3),
                                 self.vc.current_stream.stream_id, plan_args)

    def labelled_transients(self, steps: Iterable[tuple[str, str, int]], op: str, module: str, source: str,
                            stream: int, plan_args: Any = None) -> None:
        """:meth:`transients` labelled by the caller (a decode step made from its pattern runs no op)."""
        at = len(self.events)
        slots: dict[str, TraceEvent] = {}
        for action, slot, nbytes, *like in steps:  # (like: the copied tensor's shape and dtype, where a step says)
            if action == "alloc":
                slots[slot] = self.add_event(TraceEvent(
                    ALLOC, bytes=nbytes, stream=stream, category=Category.TEMPORARY, op=op, module=module, phase=self.phase,
                    dtype=like[1] if like else "uint8", shape=like[0] if like else (nbytes,), source=source))
            else:
                a = slots.pop(slot)
                self.add_event(TraceEvent(FREE, id=a.id, bytes=a.bytes, stream=a.stream, category=a.category, op=op,
                                          module=module, phase=self.phase, dtype=a.dtype, shape=a.shape,
                                          iteration=self.iteration))
        if plan_args is not None:
            self.by_sm.append([at, len(self.events) - at, list(plan_args), stream, op, module, self.phase, source,
                               self.iteration])

    def register_root(self, module: torch.nn.Module, label: str) -> None:
        """Name a top-level module (its own ops are labelled ``label``)."""
        self._root_labels[module] = label

    # ------------------------------------------------------------------ state
    def _new_id(self) -> int:
        i = self._next_id
        self._next_id += 1
        return i

    def is_gpu(self, t: torch.Tensor) -> bool:
        if isinstance(t, UninitializedTensorMixin):  # a lazy module's placeholder: its data says where
            t = t.data
        if is_wrapper(t):  # a DTensor is where its local tensor is
            return any(self.is_gpu(x) for x in inner_tensors(t))
        return storage_key(t) in self.live

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

    @property
    def trained(self) -> bool:
        """The current iteration ran a backward pass or an optimizer step (a training step,
        not only a forward): what a notebook's steady-state loop repeats (xmem_jupyter/steady.py)."""
        return self._stepped or self._backward_done

    def set_phase(self, phase: Phase) -> None:
        if phase != self.phase:
            self.phase = phase
            self.events.append(TraceEvent(PHASE, phase=phase, iteration=self.iteration))

    def _new_iteration(self) -> None:
        if self.max_iterations is not None and self.iteration + 1 >= self.max_iterations:
            self.stopped = True
            raise StopTracing()
        self.iteration += 1
        self._stepped = self._backward_done = False
        self.events.append(TraceEvent(ITERATION, iteration=self.iteration, phase=self.phase))

    def _upgrade(self, t: torch.Tensor | None, category: Category, module: str = "") -> None:
        if t is None or isinstance(t, UninitializedTensorMixin):  # a lazy placeholder: nothing yet
            return
        if is_wrapper(t):  # a DTensor parameter / gradient / state: its local tensor's storage
            for x in inner_tensors(t):
                self._upgrade(x, category, module)
            return
        rec = self.live.get(storage_key(t))  # (a torch.func transform's wrapper: the tensor it wraps)
        if rec is None or rec.event is None:
            return
        if _RANK[category] > _RANK[rec.event.category]:
            rec.event.category = category
        if module and not rec.event.module:
            # Parameters, their gradients and optimizer state: the owning module's (made outside a forward, by .cuda())
            rec.event.module = module

    def classify_modules(self, modules: Iterable[torch.nn.Module]) -> None:
        for m in modules:
            for name, p in m.named_parameters():
                owner = name.rpartition(".")[0]
                self._param_module[p] = owner
                self._upgrade(p, Category.PARAMETER, owner)
                self._upgrade(p.grad, Category.GRADIENT, owner)
            for name, b in m.named_buffers():
                self._upgrade(b, Category.BUFFER, name.rpartition(".")[0])

    def classify_optimizer(self, opt: torch.optim.Optimizer) -> None:
        for g in getattr(opt, "param_groups", ()):  # torchao's CPUOffloadOptimizer: no Optimizer.__init__
            for p in g["params"]:
                owner = self._param_module.get(p, "")
                self._upgrade(p, Category.PARAMETER, owner)
                self._upgrade(p.grad, Category.GRADIENT, owner)
        for p, s in getattr(opt, "state", {}).items():
            if isinstance(s, dict):
                owner = self._param_module.get(p, "")
                for v in s.values():
                    if isinstance(v, torch.Tensor):
                        self._upgrade(v, Category.OPTIMIZER_STATE, owner)

    # ------------------------------------------------------------------ allocations
    def on_new_storage(self, func: Any, t: torch.Tensor, st: torch.UntypedStorage, key: int, nbytes: int) -> None:
        self._busy += 1
        try:
            ev = None
            block = None
            if nbytes > 0:
                if self.scope.category is not None:
                    category = self.scope.category
                elif self.scope.explicit and not self._module_stack and self.phase in (Phase.OTHER, Phase.FORWARD):
                    category = Category.INPUT
                elif self.phase == Phase.OTHER:
                    category = Category.OTHER
                else:
                    category = Category.TEMPORARY
                ev = TraceEvent(
                    ALLOC,
                    id=self._new_id(),
                    bytes=nbytes,
                    stream=self.vc.current_stream.stream_id,
                    category=category,
                    op=op_name(func),
                    module=self.current_module(),
                    phase=self.phase,
                    dtype=str(t.dtype).removeprefix("torch."),
                    shape=tuple(t.shape),
                    source=user_frame(4),
                    iteration=self.iteration,
                )
                try:
                    block = self.allocator.malloc(hint(nbytes), ev.stream)
                except RuntimeError as e:  # the simulated device is full (capacity / memory fraction)
                    if type(e).__name__ != "OutOfMemoryError":
                        raise
                    self.empty_cache()  # cudaMalloc's retry freed the cache before it gave up: so does the replay
                    raise as_torch_error(torch.OutOfMemoryError(f"CUDA out of memory. {str(e).partition('. ')[2]} (simulated)")) from None
                self.events.append(ev)
                self.live_bytes += hint(nbytes)
                if self.live_bytes > self.peak_live_bytes:
                    self.peak_live_bytes = self.live_bytes
            self.live[key] = LiveStorage(ev, block, weakref.ref(st, self._storage_died(key)), nbytes)
        finally:
            self._busy -= 1
            if self._pending_frees and not self._busy:
                self._drain()

    def on_gemm_into(self, func: Any, out: torch.Tensor) -> None:
        """A GEMM on the GPU that allocated nothing (its output given): where it ran, for its
        cuBLAS workspaces (:attr:`gemm_into`)."""
        self.gemm_into.append([len(self.events), op_name(func), str(out.dtype).removeprefix("torch."),
                               list(out.shape), str(self.phase), self.vc.current_stream.stream_id,
                               self.current_module(), user_frame(4), self.iteration])

    def _storage_died(self, key: int) -> Callable[[weakref.ref], None]:
        def cb(_ref: weakref.ref) -> None:
            if self._closed:
                return
            if self._busy:
                self._pending_frees.append(key)
            else:
                self.free_storage(key)

        return cb

    def _drain(self) -> None:
        pending, self._pending_frees = self._pending_frees, []
        for key in pending:
            self.free_storage(key)

    def free_storage(self, key: int) -> None:  # (also where a CUDA graph replay writes over outputs still held)
        rec = self.live.pop(key, None)
        if rec is None or rec.event is None:
            return
        a = rec.event
        self.live_bytes -= hint(a.bytes)
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

    def on_resized(self, func: Any, t: torch.Tensor, st: torch.UntypedStorage, key: int, nbytes: int) -> None:
        """``resize_`` / ``set_`` grew a GPU storage: a new block replaces the old one."""
        old = self.live.pop(key)
        old.ref = None  # type: ignore[assignment]
        if old.event is not None:
            self.live[key] = old
            self.free_storage(key)
        self.on_new_storage(func, t, st, key, nbytes)

    def storage_resized(self, st: torch.UntypedStorage) -> None:
        """``UntypedStorage.resize_`` (not an aten op: the dispatch mode does not see it) on a
        GPU storage: FSDP frees an unsharded parameter's memory with ``resize_(0)`` after
        forward and backward, and grows it back before the next all-gather."""
        key = st._cdata
        rec = self.live.get(key)
        nbytes = st.nbytes()
        if rec is not None and rec.nbytes != nbytes:
            self.on_resized(STORAGE_RESIZE, ResizedBytes(nbytes), st, key, nbytes)

    def record_stream(self, t: torch.Tensor, stream: VirtualStream) -> None:
        rec = self.live.get(t.untyped_storage()._cdata)
        if rec is None or rec.event is None:
            return
        self.events.append(
            TraceEvent(RECORD_STREAM, id=rec.event.id, bytes=rec.event.bytes, stream=rec.event.stream,
                       streams=(stream.stream_id,), phase=self.phase, iteration=self.iteration)
        )
        self.allocator.record_stream(rec.block, stream.stream_id)

    def mark(self, kind: str) -> None:
        """``empty_cache``, ``reset_peak``, ``synchronize``: in the trace, and on the live allocator now."""
        self.events.append(TraceEvent(kind, phase=self.phase, iteration=self.iteration))
        getattr(self.allocator, "reset_peak_stats" if kind == RESET_PEAK else str(kind))()

    def empty_cache(self) -> None:
        self.mark(EMPTY_CACHE)

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
    def factory_on_gpu(self) -> bool:
        """Where an op without tensor inputs puts its result: on the GPU in backward, or when
        the enclosing torch function was called with GPU tensors (library code asking
        ``x.device`` inside it sees the real CPU device)."""
        if self._backward_depth:
            return True
        scope = self.scope
        if scope.gpu_args is None:
            scope.gpu_args = False
            if scope.args:
                for x in scope.args:
                    for t in tensors_in(x):
                        if storage_key(t) in self.live:
                            scope.gpu_args = True
                            return True
        return scope.gpu_args

    @contextlib.contextmanager
    def call_scope(self, **changes: Any) -> Iterator[CallScope]:
        """Run a torch call in a scope of its own: ``changes`` (``target``, ``explicit``,
        ``args``) replace the fields of the enclosing scope, which comes back on exit. For
        code that runs kernels on the tracer's behalf (``sdpa.py``): a factory inside the
        scope follows the device of ``args``."""
        saved = self.scope
        if "args" in changes:
            changes.setdefault("gpu_args", None)
        self.scope = dataclasses.replace(saved, **changes)
        try:
            yield self.scope
        finally:
            self.scope = saved

    def register_optimizer(self, opt: torch.optim.Optimizer) -> None:
        """An optimizer the code uses (iterations then run from optimizer step to step)."""
        self._optimizers.add(opt)

    # ------------------------------------------------------------------ hooks
    def _forward_pre(self, module: torch.nn.Module, args: Any) -> None:
        if not self._module_stack and not self._backward_depth and self.phase != Phase.OPTIMIZER:
            self._root_forward(module)
        elif module not in self._names and next(module.parameters(), None) is not None:
            # a model of its own first called inside another's forward (a teacher in TRL's distillation,
            # whose loss runs as the student's forward): its weights are parameters, its modules named
            self._add_root(module)
            self.classify_modules([module])
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
            self._add_root(module)
        self._begin_forward()
        self.classify_modules([module])

    def _add_root(self, module: torch.nn.Module) -> None:
        label = self._root_labels.get(module, type(module).__name__)
        for name, m in module.named_modules():
            if m not in self._names:
                self._names[m] = name or label
                self.module_types.setdefault(name or label, type(m).__name__)
        self._roots.add(module)

    def compiled_graph_starts(self, args: Iterable[Any]) -> None:
        """A compiled graph that trains leaves (grad on, a leaf input requiring grad: parameters)
        called outside any forward starts one: ``@torch.compile`` on a function that calls the
        model runs no module hooks. (A graph on the loss alone, after the step, starts nothing.)"""
        if self.phase == Phase.OTHER and torch.is_grad_enabled() and any(
                isinstance(a, torch.Tensor) and a.requires_grad and a.is_leaf for a in args):
            self._begin_forward()

    def _begin_forward(self) -> None:
        if self.iteration < 0 or self._stepped or (self._backward_done and not self._optimizers):
            self._new_iteration()
        self.set_phase(Phase.FORWARD)

    def _optimizer_init(self) -> Callable[..., None]:
        """``Optimizer.__init__`` that tells the tracer an optimizer exists (iterations then
        run from optimizer step to optimizer step, also under gradient accumulation)."""
        orig = torch.optim.Optimizer.__init__
        optimizers = self._optimizers

        def __init__(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            orig(opt, *args, **kwargs)
            optimizers.add(opt)

        return __init__

    def _optimizer_pre(self, opt: torch.optim.Optimizer, args: tuple,
                       kwargs: dict) -> tuple[tuple, dict] | None:
        self._optimizers.add(opt)
        self.set_phase(Phase.OPTIMIZER)
        self.classify_optimizer(opt)
        # ``args`` starts with the optimizer itself (torch's step wrapper passes ``self``).
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if not callable(closure) or isinstance(closure, torch.Tensor):
            return None
        # ``step(closure)`` (LBFGS, Lightning's automatic optimization): the closure's
        # forward and backward are the step's forward and backward, not optimizer work.
        wrapped = self._step_closure(opt, closure)
        if "closure" in kwargs:
            return args, {**kwargs, "closure": wrapped}
        return (args[0], wrapped, *args[2:]), kwargs

    def _step_closure(self, opt: torch.optim.Optimizer, closure: Callable[[], Any]) -> Callable[[], Any]:
        """``closure`` as the optimizer calls it: run in the ``other`` phase (so its forward
        starts a forward as any top-level forward does), and the optimizer's own work, after
        it returns, in the ``optimizer`` phase."""

        def run_closure(*args: Any, **kwargs: Any) -> Any:
            self.set_phase(Phase.OTHER)
            try:
                return closure(*args, **kwargs)
            finally:
                self.classify_optimizer(opt)
                self.set_phase(Phase.OPTIMIZER)

        return run_closure

    def _optimizer_post(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.classify_optimizer(opt)
        self._stepped = True
        self.set_phase(Phase.OTHER)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        """Autograd saves ``t`` for backward: an activation. What is kept is a detached alias
        (same storage, no allocation): ``t`` itself would hold its own graph node when an op
        saves its output (exp, sigmoid, tanh...), a cycle through C++ that Python's collector
        cannot see, so a forward with no backward would never be freed. Autograd re-attaches
        the graph on unpack from what it saved beside the tensor, double backward included."""
        if self.phase == Phase.FORWARD:
            self._upgrade(t, Category.ACTIVATION)
        with torch._C.DisableTorchFunction():
            return t.detach()

    @contextlib.contextmanager
    def backward_phase(self, create_graph: bool = False) -> Iterator[None]:
        """A backward pass. One inside a forward (called from a module's forward, as a compiler's
        joint trace is, or building a graph on a forward's result: a gradient penalty, a PINN's
        derivatives) gives the forward its phase back: the step's own backward is still to come."""
        outer = self.phase
        inside = not self._backward_depth and (bool(self._module_stack) or (create_graph and outer == Phase.FORWARD))
        self._backward_depth += 1
        self.set_phase(Phase.BACKWARD)
        try:
            yield
        finally:
            self._backward_depth -= 1
            if inside:
                self.set_phase(outer)
            elif not self._backward_depth:
                self.classify_modules(list(self._roots))
                for opt in list(self._optimizers):
                    self.classify_optimizer(opt)
                self._seq_bounds.clear()
                self._seq_paths.clear()
                self._backward_done = True
                self.set_phase(Phase.OTHER)

    # ------------------------------------------------------------------ recording
    @contextlib.contextmanager
    def hooks(self) -> Iterator["Tracer"]:
        """The tracer's own hooks into torch (modules, optimizers, gradients, autograd's saved tensors,
        ``record_stream``), removed on exit; ``run.recording`` installs the virtual device around them."""
        import torch.nn.modules.module as module_mod
        import torch.optim.optimizer as optim_mod

        with contextlib.ExitStack() as stack:
            # Tensor.record_stream parses its argument as a C++ Stream before any mode sees it.
            stack.enter_context(patched_attr(torch.Tensor, "record_stream", self._tensor_record_stream))
            stack.enter_context(patched_attr(torch.Tensor, "register_post_accumulate_grad_hook", labelling_grad_hooks(
                torch.Tensor.register_post_accumulate_grad_hook, weakref.WeakMethod(self._label_gradient))))
            stack.enter_context(module_mod.register_module_forward_pre_hook(self._forward_pre))
            stack.enter_context(module_mod.register_module_forward_hook(self._forward_post, always_call=True))
            stack.enter_context(patched_attr(torch.optim.Optimizer, "__init__", self._optimizer_init()))
            stack.enter_context(optim_mod.register_optimizer_step_pre_hook(self._optimizer_pre))
            stack.enter_context(optim_mod.register_optimizer_step_post_hook(self._optimizer_post))
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, unpack_saved))
            yield self

    def _label_gradient(self, p: torch.Tensor) -> None:  # (a hook may outlive the trace: labelling_grad_hooks)
        if not self._closed:
            self._upgrade(p.grad, Category.GRADIENT, self._param_module.get(p, ""))

    def close(self) -> None:
        """The run is over: frees still pending are recorded, later ones are not."""
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


def unpack_saved(t: torch.Tensor) -> torch.Tensor:
    return t
