"""The patches that make torch behave, on the CPU, as it does on a GPU (or as tracing needs).

Each is applied with :func:`patched_attr` (or a context manager of its own) for the duration
of a trace only, and undone exactly: an attribute the class inherited stays inherited.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from typing import Any, Callable, Iterable, Iterator

import torch

from torch.nn.parameter import UninitializedTensorMixin

from xmem_engine.tracing.shims.subclasses import is_fake_wrapper


@contextlib.contextmanager
def patched_attr(obj: Any, name: str, value: Any) -> Iterator[None]:
    """Set ``obj.name = value`` for the duration; put back exactly what was there (an
    inherited attribute stays inherited). The one way xmem patches torch."""
    had = name in vars(obj)
    old = vars(obj).get(name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if had:
            setattr(obj, name, old)
        else:
            with contextlib.suppress(AttributeError):
                delattr(obj, name)


def labelling_grad_hooks(orig: Callable[..., Any], label: Callable[[], Any]) -> Callable[..., Any]:
    """``Tensor.register_post_accumulate_grad_hook`` whose hooks first call ``label()(p)`` (the
    tracer's, held weakly: a hook outlives the trace on the code's parameter), which names the
    new ``p.grad`` a gradient. Code that steps or offloads each parameter as its gradient is
    made (PyTorch's "optimizer step in backward" recipe, torchao's ``CPUOffloadOptimizer``)
    frees it before the backward ends, where the tracer labels gradients: they were "temporary"."""

    def register_post_accumulate_grad_hook(t: torch.Tensor, hook: Callable[[torch.Tensor], None]) -> Any:
        def labelled(p: torch.Tensor) -> None:
            fn = label()
            if fn is not None:
                fn(p)
            return hook(p)

        return orig(t, labelled)

    return register_post_accumulate_grad_hook


def restore_default_device(device: torch.device) -> None:
    if torch.get_default_device() != device:
        torch.set_default_device(device if device.type != "cpu" else None)


@contextlib.contextmanager
def logger_level(name: str, level: int) -> Iterator[None]:
    logger = logging.getLogger(name)
    old = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(old)


@contextlib.contextmanager
def mkldnn_disabled() -> Iterator[None]:
    was = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(was)


def cudnn_refused() -> contextlib.AbstractContextManager:
    """``torch.backends.cudnn.is_acceptable`` says no while tracing. Virtual-GPU tensors
    report ``is_cuda``, so on a CUDA build of torch ``nn.LSTM`` / ``nn.GRU`` would flatten
    their weights with cuDNN (``torch.cuda.device_of``, ``_cudnn_rnn_flatten_weight``):
    CUDA-only calls that fail without a driver. Refused, RNNs take the same CPU kernels in
    fake and real mode, on a CPU or a CUDA build of torch alike."""
    import torch.backends.cudnn as cudnn

    return patched_attr(cudnn, "is_acceptable", lambda tensor: False)


@contextlib.contextmanager
def appended(items: list, item: Any) -> Iterator[None]:
    added = item not in items
    if added:
        items.append(item)
    try:
        yield
    finally:
        if added and item in items:
            items.remove(item)


@contextlib.contextmanager
def patched_item(mapping: dict, key: Any, value: Any) -> Iterator[None]:
    """``mapping[key] = value`` for the duration; the old entry (or none) back after."""
    had, old = key in mapping, mapping.get(key)
    mapping[key] = value
    try:
        yield
    finally:
        if had:
            mapping[key] = old
        else:
            mapping.pop(key, None)


def module_apply(self: torch.nn.Module, fn: Callable, recurse: bool = True) -> torch.nn.Module:
    """``nn.Module._apply`` with the CPU semantics (rebind ``param.data``) for fake tensors too.

    PyTorch swaps fake parameters with ``torch.utils.swap_tensors``, which refuses tensors
    that carry weakrefs (fake tensors do); a module moved to the virtual GPU keeps its
    Parameter objects, as it does on a real GPU.
    """
    fake_type = loaded_fake_tensor_type()

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
        if isinstance(param, UninitializedTensorMixin):
            # a lazy module's placeholder stays one (its class is how the module knows to
            # infer the shape); it moves, and is materialized where it now is
            param.data = applied
            continue
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


def in_process_iterator(loader: Any) -> Any:
    """``DataLoader._get_iterator`` with ``num_workers=0`` whatever was asked."""
    from torch.utils.data.dataloader import _SingleProcessDataLoaderIter

    workers = loader.num_workers
    loader.num_workers = 0
    try:
        return _SingleProcessDataLoaderIter(loader)
    finally:
        loader.num_workers = workers


#: what the estimate says when compiled code ran eagerly (once, at the first compiled call)
COMPILE_NOTE = ("torch.compile at {where} ran eagerly ({why}): the estimate is the eager step's. A compiled "
                "step (Inductor) fuses ops, which often holds less activation memory, and compiles and "
                "autotunes inside its first call")


def eager_compiled(fn: Any, where: str, why: str, notes: list[str],
                   on_gpu: Callable[[tuple, dict], bool] = lambda args, kwargs: True) -> Any:
    """What ``torch.compile(fn)`` gives where xmem cannot compile for the GPU: ``fn`` itself,
    run eagerly.

    :data:`COMPILE_NOTE` is added once, naming where ``torch.compile`` was applied (the user's
    line, or a trainer's) and why, when compiled code first runs: a library that decorates its
    own functions with ``torch.compile`` at import (bitsandbytes does, for CPU kernels a GPU
    never runs) has compiled nothing of the user's step, nor has a call that ``on_gpu`` says
    touches no virtual-GPU tensor. A module given to ``torch.compile`` is returned as it is
    and noted at once (the user applied it to the model they train)."""
    import functools

    def note() -> None:
        if not any(n.startswith("torch.compile at ") and "ran eagerly" in n for n in notes):
            notes.append(COMPILE_NOTE.format(where=where or "(library code)", why=why))

    if isinstance(fn, torch.nn.Module):
        note()
        return fn
    if not callable(fn):
        return fn  # torch.compile itself says what is wrong when compiling for real

    @functools.wraps(fn)
    def compiled(*args: Any, **kwargs: Any) -> Any:
        if on_gpu(args, kwargs):
            note()
        return fn(*args, **kwargs)

    return compiled


def fake_parameter_new(fake_mode: Any) -> Callable:
    """Fake mode: every ``nn.Parameter`` holds a fake tensor, whatever its size, so that model
    weights never take host memory and keep their identity when moved to the GPU."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import _disable_current_modes

    orig_new = torch.nn.Parameter.__new__

    def __new__(cls: type, data: torch.Tensor | None = None, requires_grad: bool = True) -> torch.Tensor:
        # A DTensor of fake tensors (FSDP2's sharded parameter) stays as it is: faking it again
        # would give its local tensor a storage of its own, apart from the shard FSDP keeps.
        if isinstance(data, torch.Tensor) and not isinstance(data, FakeTensor) and not is_fake_wrapper(data):
            with _disable_current_modes():
                data = fake_mode.from_tensor(data)
        return orig_new(cls, data, requires_grad)

    return __new__


def storage_from_buffer() -> classmethod:
    """Fake mode: ``UntypedStorage.from_buffer`` makes a host storage of the bytes, as it does
    on a GPU run. Under a fake mode torch makes a meta storage, which ``torch.ByteTensor(s)``
    refuses: ``torch.distributed``'s object collectives (``broadcast_object_list``,
    ``all_gather_object``: Lightning's and accelerate's broadcasts) pickle through it."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    orig = torch.UntypedStorage.from_buffer

    def from_buffer(cls: type, *args: Any, **kwargs: Any) -> torch.UntypedStorage:
        with unset_fake_temporarily():
            return orig(*args, **kwargs)

    return classmethod(from_buffer)


def fake_tensor_as_parameter_class() -> staticmethod:
    """Fake mode: ``type(param)(data, requires_grad=...)`` makes a parameter, as it does on a GPU.

    A fake parameter's ``type`` is ``FakeTensor`` (``isinstance(p, nn.Parameter)`` holds through
    ``_is_param``), and libraries rebuild parameters from their class: accelerate's
    ``set_module_tensor_to_device`` (every layer ``device_map="auto"`` offloads to the CPU or
    disk) called ``FakeTensor(meta, requires_grad=False)`` and stopped the script
    ("missing required argument: 'fake_mode'"). That call shape (a tensor and
    ``requires_grad``, by name or position) is ``nn.Parameter``'s; every other goes to
    FakeTensor's own."""
    from torch._subclasses.fake_tensor import FakeTensor

    orig_new = vars(FakeTensor)["__new__"].__func__

    def __new__(cls: type, *args: Any, **kwargs: Any) -> torch.Tensor:
        if cls is FakeTensor and args and isinstance(args[0], torch.Tensor):
            if len(args) == 1 and set(kwargs) == {"requires_grad"}:
                return torch.nn.Parameter(args[0], kwargs["requires_grad"])
            if len(args) == 2 and isinstance(args[1], bool) and not kwargs:
                return torch.nn.Parameter(args[0], args[1])
        return orig_new(cls, *args, **kwargs)

    return staticmethod(__new__)


# Random initialisers skipped in fake mode. ``constant_``, ``ones_`` and ``zeros_`` run: a
# fill costs nothing on a fake tensor, and a small one's values become known (a zero bias
# keeps Adafactor's ``max(eps, rms)`` on the branch a GPU takes, see guesses.py).
INIT_FUNCTIONS = (
    "uniform_", "normal_", "trunc_normal_", "eye_", "dirac_",
    "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_",
)


def skip_init(orig: Callable) -> Callable:
    """Fake mode: weight initialisers leave fake tensors as they are - values do not matter
    for memory, and some initialisers read values (``trunc_normal_`` loops on ``mask.any()``)."""
    from torch._subclasses.fake_tensor import FakeTensor

    def init(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if isinstance(tensor, FakeTensor) or is_fake_wrapper(tensor):
            return tensor
        return orig(tensor, *args, **kwargs)

    init.__name__ = orig.__name__
    init.__doc__ = orig.__doc__
    init.__wrapped__ = orig  # type: ignore[attr-defined]
    return init


def real_mode_for_lazy_modules(orig: Callable) -> Callable:
    """Fake mode: a lazy module (``nn.LazyLinear``...) materializes its parameters in its first
    forward by assigning ``.data`` of a Parameter that is not a fake tensor, which fake tensors
    cannot stand in for; auto mode then traces the step in real mode (lazy models are small)."""
    from xmem_engine.tracing.errors import NeedsRealValues
    from xmem_engine.tracing.frames import user_frame

    def materialize(self: Any, shape: Any, device: Any = None, dtype: Any = None) -> None:
        raise NeedsRealValues("UninitializedParameter.materialize",
                              "a lazy module infers its parameters' shapes in its first forward", user_frame())

    materialize.__wrapped__ = orig  # type: ignore[attr-defined]
    return materialize


def loaded_fake_tensor_type() -> type | None:
    """FakeTensor if fake tensors are in use (importing them costs seconds: torch._dynamo)."""
    mod = sys.modules.get("torch._subclasses.fake_tensor")
    return getattr(mod, "FakeTensor", None) if mod is not None else None


def outside_mode(orig: Callable[..., Any], handler: Callable[[Any, tuple, dict], Any], mode: Any) -> Callable[..., Any]:
    """``orig`` (a function the device mode rewrites, e.g. ``F.scaled_dot_product_attention``
    or ``F.dropout``) for code that runs while the tracer's device mode is off: inside the
    mode's own handler (``nn.MultiheadAttention`` reaching attention from a handled function).
    With the mode on, ``orig``, which the mode sends to ``handler``; with it off, ``handler``
    directly. Either way the handler runs with the mode off, and forward and a checkpoint's
    recomputation allocate alike (checkpointing checks that they do). It keeps ``orig``'s name
    and docstring: libraries read them (Unsloth looks for ``enable_gqa`` in attention's
    docstring to know whether it may use grouped-query attention)."""

    @functools.wraps(orig, updated=())
    def call(*args: Any, **kwargs: Any) -> Any:
        if mode.on_stack():
            return orig(*args, **kwargs)
        return handler(orig, args, kwargs)

    return call


def storage_resize(tracer: Any) -> Callable[..., Any]:
    """``UntypedStorage.resize_`` that tells the tracer: a storage's bytes change outside any
    aten op (FSDP frees and regrows its unsharded parameters this way)."""
    orig = torch.UntypedStorage.resize_

    def resize_(self: torch.UntypedStorage, size: int) -> Any:
        out = orig(self, size)
        tracer.storage_resized(self)
        return out

    resize_.__wrapped__ = orig  # type: ignore[attr-defined]
    return resize_


def checkpoint_metadata(tracer: Any) -> Callable[[torch.Tensor], dict]:
    """``torch.utils.checkpoint``'s check that a recomputation made what forward saved
    (shape, dtype, device), with the device as the virtual GPU has it: forward saves from
    inside the device mode's handler (the mode off: a CPU device), backward's engine runs
    with the mode on (``DeviceMode.in_backward_engine``: a CUDA one) - the same tensor."""

    def extract(x: torch.Tensor) -> dict:
        return {"shape": x.shape, "dtype": x.dtype, "device": tracer.vc.device if tracer.is_gpu(x) else torch.device("cpu")}

    return extract


class ProcessExit(SystemExit):
    """``os._exit(status)`` in traced code: ends the code like ``sys.exit``, without ``atexit``."""


class ScriptEnd:
    """How a script may end the process, kept inside the trace (issue #36): ``os._exit(n)``
    raises ``SystemExit(n)`` where it is called, as ``sys.exit(n)`` would, instead of ending
    xmem with it (a scheduler read exit 0 and no answer); ``atexit`` handlers the user's code
    registers run when the code ends, inside the trace, not after xmem has printed its
    result. Handlers that libraries register (thread pools, caches) keep their process-exit
    meaning: they are left to ``atexit``. A child process the code forks ends at its
    ``os._exit`` as it would (multiprocessing's fork children end so): were it to raise, the
    child would unwind into xmem and end the trace there, removing the trace's placeholders
    from under the parent (Unsloth checks its statistics in a forked child)."""

    def __init__(self) -> None:
        self.handlers: list[tuple[Callable, tuple, dict]] = []
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "ScriptEnd":
        import atexit
        import os

        from xmem_engine.tracing.frames import is_user_file

        orig_register, orig_unregister = atexit.register, atexit.unregister

        traced, orig_exit = os.getpid(), os._exit

        def _exit(status: int) -> None:
            if os.getpid() != traced:  # a child forked by the code (multiprocessing's fork): it ends
                orig_exit(status)
            raise ProcessExit(status)

        def register(func: Callable, *args: Any, **kwargs: Any) -> Callable:
            if is_user_file(sys._getframe(1).f_code.co_filename):
                self.handlers.append((func, args, kwargs))
                return func
            return orig_register(func, *args, **kwargs)

        def unregister(func: Callable) -> None:
            self.handlers = [h for h in self.handlers if h[0] != func]
            orig_unregister(func)

        _exit.__wrapped__ = orig_exit  # type: ignore[attr-defined]
        self._stack.enter_context(patched_attr(os, "_exit", _exit))
        self._stack.enter_context(patched_attr(atexit, "register", register))
        self._stack.enter_context(patched_attr(atexit, "unregister", unregister))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()

    def run_handlers(self) -> None:
        """The user's ``atexit`` handlers, last registered first; an exception in one is
        printed and the others still run, as at interpreter exit."""
        import traceback

        while self.handlers:
            func, args, kwargs = self.handlers.pop()
            try:
                func(*args, **kwargs)
            except SystemExit:
                pass
            except Exception:  # noqa: BLE001 - as atexit does: print, go on
                print("Exception ignored in atexit callback", func, file=sys.stderr)
                traceback.print_exc()


@contextlib.contextmanager
def on_import(names: Iterable[str], then: Callable[[Any], None]) -> Iterator[None]:
    """``then(module)`` for each module of ``names``: now if it is imported, else right after
    it is, while the block lasts. Why: a library the traced code imports lazily (Triton,
    bitsandbytes) is patched as it loads, and a trace that never imports it pays nothing for
    it (Triton costs a third of a second to import)."""
    watched = frozenset(names)
    for name in watched:
        if name in sys.modules:
            then(sys.modules[name])
    hook = _ImportHook(watched, then)
    sys.meta_path.insert(0, hook)
    try:
        yield
    finally:
        hook.active = False
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(hook)


class _ImportHook:
    """A meta-path finder for the watched names only: it asks the finders after it for the
    module's spec (site-packages, an editable install) and wraps its loader."""

    def __init__(self, names: frozenset[str], then: Callable[[Any], None]):
        self.names, self.then, self.active = names, then, True

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.names:
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _ThenLoader(spec.loader, self)
        return spec


class _ThenLoader:
    """A module's own loader, and ``then(module)`` once it has executed (if the block still lasts)."""

    def __init__(self, loader: Any, hook: _ImportHook):
        self.loader, self.hook = loader, hook

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        if self.hook.active:
            self.hook.then(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename... for tracebacks
        if name == "loader":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)


#: library singletons a process starts without: (module, classes whose ``_shared_state`` dict
#: is the singleton). accelerate's ``Accelerator()`` fills them once per process.
SINGLETONS = (("accelerate.state", ("PartialState", "AcceleratorState", "GradientState")),)


def fresh_singletons(stack: contextlib.ExitStack) -> contextlib.AbstractContextManager:
    """Each trace starts with the library singletons of a new process (:data:`SINGLETONS`) and
    hands back the ones it found. A script runs in a process of its own; traced in the notebook
    or again by the advisor, its ``Accelerator(...)`` met the last trace's state (and refused
    another ``mixed_precision``), and changed the user's own."""

    def fresh(module: Any, names: tuple[str, ...]) -> None:
        for name in names:
            state = getattr(getattr(module, name, None), "_shared_state", None)
            if type(state) is dict:  # not accelerate's thread-local one (TPU)
                saved = dict(state)
                state.clear()
                stack.callback(lambda s=state, k=saved: (s.clear(), s.update(k)))

    watched = dict(SINGLETONS)
    return on_import(list(watched), lambda module: fresh(module, watched[module.__name__]))
