"""The dispatch mode: every aten op, and the GPU storages it makes.

A :class:`torch.utils._python_dispatch.TorchDispatchMode` sees every aten op. A storage it
has not seen before is an allocation; it is "on the GPU" when the op was a transfer to / a
factory on ``cuda`` (the call's :class:`~xmem_engine.tracing.scope.CallScope`) or read a GPU
storage. A weakref on the storage reports the free at the moment the storage dies: the
moment the caching allocator would get the block back. Views share their storage (no
allocation); in-place ops allocate nothing.

In fake mode the GPU side runs under :class:`FakeTensorMode` (no arithmetic, no memory);
CPU-side work on real tensors (data loading, samplers, metrics) runs for real, and so does a
host factory up to ``HOST_REAL_BYTES``. Hot ops take the shortcuts of ``fake_fastpaths.py``;
values fake tensors lack come from ``shadow_values.py`` or raise :class:`NeedsRealValues`.
In backward, gradient sums are rewritten in place as CUDA's autograd does them
(``grad_accumulation.py``).
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from xmem_engine.tracing.shims.subclasses import is_fake_wrapper, is_wrapper, tensors_in

from xmem_engine.tracing.kernels.cuda_temporaries import RULES as CUDA_TEMPORARIES
from xmem_engine.tracing.kernels.cuda_temporaries import BySM
from xmem_engine.tracing.kernels.cuda_dtypes import RULES as CUDA_DTYPES
from xmem_engine.gpus import cuda_libraries
from xmem_engine.tracing.kernels import convolutions
from xmem_engine.tracing.errors import META_LEAK_REASON, SPARSE_REASON, NeedsRealValues, is_meta_leak
from xmem_engine.tracing.fake.fake_fastpaths import FAST_FAKE
from xmem_engine.tracing.fake.sparse_entries import RULES as SPARSE_FAKE
from xmem_engine.tracing.frames import as_torch_error, user_frame
from xmem_engine.tracing.kernels.grad_accumulation import BackwardInPlace
from xmem_engine.tracing.fake.guesses import BEFORE_FAKE
from xmem_engine.tracing.host_memory import CHECK_BYTES, HostMemoryExceeded
from xmem_engine.tracing.scope import CPU, CallScope, Device
from xmem_engine.tracing.symbolic import is_symbolic
from xmem_engine.tracing.tracer import Tracer
from xmem_engine.tracing.ops import register


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
_SCALAR = torch.ops.aten._local_scalar_dense.default
try:  # the partitioner's RNG ops for a checkpointed region's dropout: (save the state and run, run with it)
    from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state
    _RNG_STATE_OPS: tuple = (run_and_save_rng_state, run_with_rng_state)
except ImportError:  # pragma: no cover - an older torch
    _RNG_STATE_OPS = ()


# Outputs that stay on the host when the op runs on CUDA (by position among the op's tensors).
HOST_OUTPUTS: dict[Any, frozenset[int]] = {
    torch.ops.aten._pack_padded_sequence.default: frozenset({1}),  # batch_sizes
}


def _composite_implicit(func: Any) -> bool:
    """An op that is only a composition of others: a CompositeImplicitAutograd kernel and no
    kernel of its own (``silu_backward`` has both: a device runs its own kernel)."""
    name = getattr(func, "name", None)
    if not callable(name) or getattr(func, "namespace", "aten") != "aten":
        return False
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    try:
        return has(name(), "CompositeImplicitAutograd") and not any(
            has(name(), key) for key in ("CPU", "CUDA", "CompositeExplicitAutograd"))
    except RuntimeError:
        return False


def _is_mutable(func: Any) -> bool:
    schema = getattr(func, "_schema", None)
    return bool(schema is not None and schema.is_mutable)


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
        if isinstance(a, FakeTensor) or (isinstance(a, torch.Tensor) and is_fake_wrapper(a)):
            return True
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, FakeTensor) or (isinstance(b, torch.Tensor) and is_fake_wrapper(b)):
                    return True
    return False


def _has_wrapper(args: tuple) -> bool:
    """A wrapper subclass (DTensor) among ``args`` or their lists."""
    for a in args:
        if isinstance(a, (list, tuple)):
            if a and any(isinstance(b, torch.Tensor) and is_wrapper(b) for b in a):
                return True
        elif isinstance(a, torch.Tensor) and is_wrapper(a):
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


class AllocMode(TorchDispatchMode):
    """Sees every aten op; turns new GPU storages into ``alloc`` events."""

    # A higher-order op (a Triton kernel's launch in a Dynamo graph run eagerly, when compiling
    # it failed) is passed on: what it allocates comes back through here as aten ops.
    supports_higher_order_operators = True

    def __init__(self, tracer: Tracer):
        super().__init__()
        self.t = tracer
        self.fake_errors = _fake_exceptions() if tracer.fake else ()
        self.mutable: dict[Any, bool] = {}
        self.aliased: dict[Any, bool] = {}  # func -> whether every output is an input it wrote
        self.composite: dict[Any, bool] = {}
        self.gemm: dict[Any, bool] = {}  # func -> whether it is a GEMM (cuBLAS workspaces)
        self.backward_writes = BackwardInPlace()

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No ``torch._disable_dynamo`` wrapper around ``__torch_dispatch__`` (TorchDispatchMode's
        opt-out): it turns Dynamo's frame hook off and on for every op, 2% of a ``generate()``
        trace (a third of whose ops are ``prim.device`` queries). Dynamo is kept out of the
        tracer's handlers by ``mode_stacks.dynamo_skips_the_tracer`` wherever it compiles."""
        return False

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Dynamo compiles with this mode on the stack (and turns it off while compiling):
        only the compiled artifact's runtime ops come here (``torch_compile.py``)."""
        return True

    def _rng_state_op(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """The partitioner's RNG ops around a checkpointed region's dropout, recomputed in backward
        (``run_and_save_rng_state(op, ...)``, ``run_with_rng_state(state, op, ...)``): the state
        is the GPU's, CUDA's 16 bytes (philox seed and offset: ``torch.cuda.get_rng_state``), not
        the host generator's that the CPU kernel these tensors reach would save; the op is seen."""
        saving = func is _RNG_STATE_OPS[0]
        op, rest = (args[0], args[1:]) if saving else (args[1], args[2:])
        on_gpu = any(isinstance(a, torch.device) and a.type == "cuda" for a in rest)  # Inductor's seeds
        rest = tuple(CPU if isinstance(a, torch.device) and a.type == "cuda" else a for a in rest)
        tr, saved = self.t, self.t.scope
        if on_gpu:
            tr.scope = CallScope(Device.GPU, False, rest, None, saved.category)
        try:
            with self:
                out = op(*rest, **kwargs)
        finally:
            tr.scope = saved
        return (torch.cuda.get_rng_state(), out) if saving else out

    def _between_graphs(self, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        """An op of the code Dynamo leaves to Python inside a compiled call (a
        ``torch.compiler.disable``d function, a custom op and its fake kernel, the call at a graph
        break): it runs without the device mode (``torch_compile.py``), so it is placed here as the
        device mode places it: a ``cuda`` device is the virtual GPU. Inside it, tensors report
        their device as eager code sees it (a fake kernel's ``torch.empty(device=w.device)``)."""
        tr = self.t
        d = kwargs.get("device")
        saved = tr.scope
        if d is not None and torch.device(d).type == "cuda":
            kwargs = {**kwargs, "device": CPU}
            tr.scope = CallScope(Device.GPU, False, args, None, saved.category)  # a library's buffer, not input
        tr.in_dynamo = False
        try:
            return self.__torch_dispatch__(func, types, args, kwargs)
        finally:
            tr.in_dynamo, tr.scope = True, saved

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is _PRIM_DEVICE and self.fake_errors:
            # C++ asks every fake tensor for its device (autograd does so per input; a third of
            # a decode step's ops): answer from the tensor without a round trip through
            # FakeTensorMode, first of all.
            dev = getattr(args[0], "fake_device", None)
            if dev is not None:
                return dev
        if isinstance(func, torch._ops.HigherOrderOperator):
            if func in _RNG_STATE_OPS and not self.t.compiling:
                return self._rng_state_op(func, args, kwargs or {})
            return func(*args, **(kwargs or {}))
        if self.t.compiling:  # a compiler's own ops on its own fake tensors (Inductor's lazy backward)
            return func(*args, **(kwargs or {}))
        if self.t.in_dynamo:
            return self._between_graphs(func, types, args, kwargs or {})
        top = torch._C._len_torch_function_stack()
        if top and torch._C._get_function_stack_at(top - 1) is self.t.device_mode:
            # autograd's engine runs with the device mode on (DeviceMode.in_backward_engine):
            # an aten op's handling is below it, as in forward.
            mode = torch._C._pop_torch_function_stack()  # (torch.overrides._pop_mode_temporarily, without its generator)
            try:
                return self.__torch_dispatch__(func, types, args, kwargs)
            finally:
                torch._C._push_on_torch_function_stack(mode)
        kwargs = kwargs or {}
        composite = self.composite.get(func)
        if composite is None:
            composite = self.composite[func] = _composite_implicit(func)
        if composite:
            # Reaches here whole only where autograd's keys are off (inference_mode): on a GPU
            # it runs as its parts, each allocating (einsum's operand copies): run them here.
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        tr = self.t
        if tr.phase == "backward":
            in_backward = self.backward_writes.node_changed() is not None
        else:
            in_backward = False
            if self.backward_writes.holds_node:  # a backward that raised: its graph let go (grad_accumulation.py)
                self.backward_writes.forget()
        if in_backward:  # gradient sums and scatters in place, as on a GPU (grad_accumulation.py)
            func, args, kwargs = self.backward_writes.rewrite(func, args, kwargs) or (func, args, kwargs)
        if tr.user_state is not None and tr.user_state.watching:
            mutable = self.mutable.get(func)
            if mutable is None:
                mutable = self.mutable[func] = _is_mutable(func)
            if mutable:  # copy-on-write of the user's tensors, put back when tracing ends
                for t in tensors_in(args):
                    tr.user_state.before_write(t)
                for t in tensors_in(tuple(kwargs.values())):
                    tr.user_state.before_write(t)
        if self.fake_errors:
            if (tr.scope.target is not Device.GPU or self._kept_on_host(args, kwargs)) and not _has_fake_tensor(args) and not (kwargs and _has_fake_tensor(tuple(kwargs.values()))):
                factory = not _has_tensor(args) and not (kwargs and _has_tensor(tuple(kwargs.values())))
                if not factory or not tr.factory_on_gpu():
                    return self._run_on_host(func, args, kwargs, factory)
            try:
                sparse = SPARSE_FAKE.get(func)  # sparse tensors made with their entries (a dense clone: NotImplemented)
                out = sparse(tr.guesses, func, args, kwargs) if sparse is not None and not _has_wrapper(args) \
                    else NotImplemented
                fast = FAST_FAKE.get(func)
                if fast is not None and _has_wrapper(args):
                    fast = None  # DTensors (FSDP2 + a foreach optimizer): their own dispatch, on the shards
                if fast is None and func in BEFORE_FAKE:
                    fast = lambda *a, **k: tr.guesses.data_dependent(func, a, k)  # noqa: E731
                elif fast is None and func in CUDA_DTYPES and self._on_gpu(args, kwargs):
                    fast = CUDA_DTYPES[func]  # kernels/cuda_dtypes.py
                if out is NotImplemented and fast is not None:
                    out = fast(*args, **kwargs)
                if out is NotImplemented:
                    try:
                        out = func(*args, **kwargs)
                    except self.fake_errors as e:
                        if _custom_without_fake_kernel(func, e):
                            out = self._custom_for_real(func, args, kwargs)
                        else:
                            # values the fake tensors lack: known ones come from the shadows,
                            # the others are guessed (guesses.py)
                            out = tr.shadows.data_dependent(func, args, kwargs, tr.fake_mode)
                            if out is NotImplemented and not (tr.guesses.defer and func is _SCALAR):
                                out = tr.guesses.data_dependent(func, args, kwargs)
                            if out is NotImplemented:
                                raise NeedsRealValues(str(func), _fake_reason(e), user_frame(2)) from e
                    except RuntimeError as e:
                        if isinstance(e, NotImplementedError) and "'SparseMeta' backend" in str(e):
                            raise NeedsRealValues(str(func), "fake tensors have no kernel for this sparse op",
                                                  user_frame(2)) from e
                        if is_meta_leak(e):
                            raise NeedsRealValues(str(func), META_LEAK_REASON, user_frame(2)) from e
                        if not _custom_without_fake_kernel(func, e):
                            raise
                        out = self._custom_for_real(func, args, kwargs)
                    else:
                        if isinstance(out, torch.Tensor) and out.layout is not torch.strided and _lost_entries(out, args):
                            raise NeedsRealValues(str(func), SPARSE_REASON, user_frame(2))
                        tr.shadows.after_op(func, args, kwargs, out)
                        tr.guesses.after_op(func, args, kwargs, out)
                else:
                    tr.shadows.after_op(func, args, kwargs, out)
                    tr.guesses.after_op(func, args, kwargs, out)
            except RuntimeError as e:
                err = _as_torch_error(e, args)
                if err is e:
                    raise  # any other error as it was, cause and traceback kept
                raise err from None
        else:
            rule = CUDA_DTYPES.get(func)
            out = rule(*args, **kwargs) if rule is not None and self._on_gpu(args, kwargs) else NotImplemented
            if out is NotImplemented:
                try:
                    out = func(*args, **kwargs)
                except RuntimeError as e:
                    err = _host_refused(e, tr)
                    if err is None:
                        raise
                    raise err from None
        live = tr.live
        gpu: bool | None = None
        conv_copies = None
        if func in convolutions.OPS and (gpu := self._on_gpu(args, kwargs)):
            out, conv_copies = convolutions.as_on_cuda(func, args, kwargs, out)  # CUDA's layouts and copies
        budget = tr.host_budget
        host = HOST_OUTPUTS.get(func)
        made = False
        for i, t in enumerate(tensors_in(out)):
            st = t.untyped_storage()
            key = st._cdata
            rec = live.get(key)
            nbytes = st.nbytes()
            if rec is not None:
                if rec.nbytes != nbytes:
                    tr.on_resized(func, t, st, key, nbytes)
                continue
            if budget is not None and nbytes >= CHECK_BYTES and not t.is_meta:  # real mode: stop before the host runs out
                budget.check(nbytes)
            if host is not None and i in host:
                continue
            if gpu is None:
                gpu = self._on_gpu(args, kwargs)
            if gpu:
                if self._written_in_place(func):
                    continue  # a host tensor an op wrote into (``host_buffer.copy_(gpu_tensor)``)
                tr.on_new_storage(func, t, st, key, nbytes)
                made = True
        if not made and isinstance(out, torch.Tensor):
            gemm = self.gemm.get(func)
            if gemm is None:
                gemm = self.gemm[func] = cuda_libraries.op_name(str(func)) in cuda_libraries.GEMM_OPS
            if gemm and (gpu if gpu is not None else self._on_gpu(args, kwargs)):
                tr.on_gemm_into(func, out)  # mm(..., out=buf): cuBLAS still takes its workspace
        rule = CUDA_TEMPORARIES.get(func)
        if rule is not None and (gpu if gpu is not None else self._on_gpu(args, kwargs)):
            steps = rule(args, kwargs, tr.cuda_device)
            if isinstance(steps, BySM):
                tr.transients(func, steps.steps(tr.cuda_device), steps.plan_args)
            elif steps:
                tr.transients(func, steps)
        if func in convolutions.OPS and gpu:
            if conv_copies:
                tr.transients(func, conv_copies)
            convolutions.record(tr, func, args, kwargs, out)  # cuDNN's problems: workspaces by target GPU
        if in_backward:
            self.backward_writes.made(tensors_in(out))
        if tr.op_hooks:
            for hook in tr.op_hooks:
                hook(tr, func, args, kwargs, out)
        return out

    def _custom_for_real(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """A custom op (``torch.library``) with no fake kernel: run its real kernel once, on
        zero-filled real tensors of its inputs' sizes, strides and dtypes, and carry on with
        fake tensors like its outputs; the rest of the code stays in fake mode. Its output
        sizes, the only thing the estimate takes from it, rarely depend on input values; the
        trace's notes name the op and where it was called."""
        from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
        from torch.utils._pytree import tree_map

        tr = self.t

        def real(x: Any) -> Any:
            if isinstance(x, FakeTensor):
                return torch.empty_strided(x.size(), x.stride(), dtype=x.dtype).zero_()
            return x

        with unset_fake_temporarily(), torch.no_grad():
            out = func(*tree_map(real, args), **tree_map(real, kwargs))
        tr.real_ops[func.name()] = tr.real_ops.get(func.name(), 0) + 1
        where = user_frame(3)
        note = (f"{func.name()} has no fake kernel: it ran for real once on zero-filled inputs of the right "
                f"sizes{' at ' + where if where else ''} (register_fake would keep it in fake mode)")
        if note not in tr.notes:
            tr.notes.append(note)
        return tree_map(lambda t: tr.fake_mode.from_tensor(t) if isinstance(t, torch.Tensor) else t, out)

    def _run_on_host(self, func: Any, args: tuple, kwargs: dict, factory: bool) -> Any:
        """Fake mode, CPU-side work on real tensors: run it for real, so data loading, samplers
        and host-side logic see real values. A host factory runs fake first to learn its size:
        a big one (a weight matrix before ``.cuda()``) stays fake, so that building a large
        model costs no host memory."""
        if self.t.symbolic is not None and (is_symbolic(args) or is_symbolic(kwargs)):  # no real tensor has a symbolic size
            return func(*args, **kwargs)
        numel = _factory_numel(args) if factory else None
        if factory and (numel is None or numel * 8 > HOST_REAL_BYTES):
            try:
                trial = func(*args, **kwargs)
            except self.fake_errors as e:
                raise NeedsRealValues(str(func), _fake_reason(e), user_frame(2)) from e
            if sum(t.untyped_storage().nbytes() for t in tensors_in(trial)) > HOST_REAL_BYTES:
                return trial
            del trial
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            return func(*args, **kwargs)

    def _kept_on_host(self, args: tuple, kwargs: dict) -> bool:
        """A factory of a dtype the scope keeps on the host (the index tensors DDP's C++
        reads back, in a scope that puts its buckets on the GPU)."""
        keep = self.t.scope.host_dtypes
        return bool(keep) and kwargs.get("dtype") in keep and not _has_tensor(args)

    def _written_in_place(self, func: Any) -> bool:
        """An output of an in-place or ``out=`` op (its schema says it returns what it wrote):
        nothing was allocated. A GPU one is known already; this is a host tensor written from
        the GPU (``host_buffer.copy_(gpu_tensor)``), which a GPU run copies into without
        allocating (in fake mode the op's output is a fake stand-in for the real host tensor)."""
        aliased = self.aliased.get(func)
        if aliased is None:
            schema = getattr(func, "_schema", None)
            aliased = self.aliased[func] = bool(schema is not None and schema.returns and all(
                r.alias_info is not None and r.alias_info.is_write for r in schema.returns))
        return aliased

    def _on_gpu(self, args: tuple, kwargs: dict) -> bool:
        tr = self.t
        target = tr.scope.target
        if target is not None:
            return target is Device.GPU and not self._kept_on_host(args, kwargs)
        live = tr.live
        found = False
        for x in (args, tuple(kwargs.values())):
            for t in tensors_in(x):
                found = True
                if t.untyped_storage()._cdata in live:
                    return True
        return False if found else tr.factory_on_gpu()


_CPU_REFUSED = re.compile(r"DefaultCPUAllocator: can't allocate memory: you tried to allocate (\d+) bytes")


def _host_refused(e: RuntimeError, tr: Tracer) -> BaseException | None:
    """Real mode: the host refused a tensor outright (more than the machine has, a batch-size
    search's first size): real mode's own limit, said as such (``HostMemoryExceeded``), not an
    error of the code's. (A search does not go on to the next size: that one may fit the host's
    allocator yet fill its memory.)"""
    m = _CPU_REFUSED.search(str(e))
    if m is None:
        return None
    budget = tr.host_budget
    return HostMemoryExceeded(int(m.group(1)), budget.limit_bytes if budget is not None else 0, user_frame(3))


def _custom_without_fake_kernel(func: Any, e: BaseException) -> bool:
    """A user's or a library's own op (not aten's) that fake tensors cannot run for want of
    a fake (meta) kernel."""
    if getattr(func, "namespace", "aten") in ("aten", "prims", "prim"):
        return False
    return type(e).__name__ == "UnsupportedOperatorException" or "no fake impl" in str(e)


def _as_torch_error(e: RuntimeError, args: tuple) -> BaseException:
    """The error a real kernel gives where fake tensors' meta functions give a bare check
    ("Expected cond to be True"): a negative size (``--set batch_size=-1``) says so."""
    if str(e).startswith("Expected cond to be True"):
        for a in args:
            if isinstance(a, (list, tuple)) and any(type(d) is int and d < 0 for d in a):
                bad = next(d for d in a if type(d) is int and d < 0)
                return as_torch_error(RuntimeError(f"Trying to create tensor with negative dimension {bad}: {list(a)}"))
    return e


def _lost_entries(out: torch.Tensor, args: tuple) -> bool:
    """A sparse output of sparse inputs with fewer entries than they have: fake tensors do not
    know how many it has (a view, ``detach``, keeps them; a transpose's coalesce is unknown)."""
    def entries(t: torch.Tensor) -> int:
        return (t._values() if t.layout is torch.sparse_coo else t.values()).numel()

    most = max((entries(a) for a in args if isinstance(a, torch.Tensor) and a.layout is not torch.strided), default=0)
    return entries(out) < most


def _fake_reason(e: BaseException) -> str:
    name = type(e).__name__
    if name == "DynamicOutputShapeException":
        return "its output shape depends on tensor values"
    if name in ("DataDependentOutputException", "GuardOnDataDependentSymNode"):
        return "it reads tensor values"
    return f"fake tensors do not support it ({name})"


register("host output", HOST_OUTPUTS, __name__)
