"""The tracer's modes and hooks taken off (and put back on) PyTorch's stacks around a compiled call.

Dynamo traces a compiled call's Python without the tracer's torch-function mode (the device
mode's rewrites would become part of the graph). From torch 2.10 a dispatch mode can stay on the
stack while Dynamo compiles (``TorchDispatchMode.ignore_compile_internals``: Dynamo turns it off
while compiling and the compiled code's ops reach it); before that, Dynamo compiles nothing while
a non-infra dispatch mode is on the stack ("non-infra torch dispatch mode present"), so there the
tracer's dispatch mode is taken off for the call and put back while the compiled code runs.
The tracer's module hooks and saved-tensor hooks are taken off likewise (:func:`hooks_off`).
"""

from __future__ import annotations

import contextlib
import types
from typing import Any, Callable, Iterator

import torch
import torch.utils._python_dispatch as python_dispatch
from torch.overrides import _get_current_function_mode_stack

#: the ``disable_saved_tensors_hooks`` each :func:`hooks_off` set aside, innermost last
_SET_ASIDE: list[Any] = []

#: whether Dynamo compiles with a dispatch mode that ignores compile internals on the stack
DYNAMO_KEEPS_DISPATCH_MODES = hasattr(python_dispatch, "is_in_any_mode_without_ignore_compile_internals")


@contextlib.contextmanager
def function_stack(modes: list[Any]) -> Iterator[None]:
    """This thread's torch-function mode stack replaced by ``modes`` (innermost last) for the
    block, put back as it was after. The modes are pushed as they are, not entered."""
    n = torch._C._len_torch_function_stack()
    before = [torch._C._pop_torch_function_stack() for _ in range(n)][::-1]
    for m in modes:
        torch._C._push_on_torch_function_stack(m)
    try:
        yield
    finally:
        for _ in range(torch._C._len_torch_function_stack()):
            torch._C._pop_torch_function_stack()
        for m in before:
            torch._C._push_on_torch_function_stack(m)


def without_function_mode(mode: Any) -> contextlib.AbstractContextManager[None]:
    """The torch-function mode stack without ``mode`` (the others keep their order)."""
    return function_stack([m for m in _get_current_function_mode_stack() if m is not mode])


def dispatch_mode_of(which: Callable[[Any], bool]) -> Any | None:
    """The innermost mode on the dispatch stack for which ``which`` is true, or None."""
    for i in reversed(range(torch._C._len_torch_dispatch_stack())):
        m = torch._C._get_dispatch_stack_at(i)
        if which(m):
            return m
    return None


@contextlib.contextmanager
def without_dispatch_mode(mode: Any) -> Iterator[None]:
    """The dispatch stack without ``mode`` (None: unchanged), the others in their order.
    Infra modes (FakeTensorMode) live outside the user stack and are not touched."""
    n = torch._C._len_torch_dispatch_stack()
    if mode is None or all(torch._C._get_dispatch_stack_at(i) is not mode for i in range(n)):
        yield
        return
    modes = [python_dispatch._pop_mode() for _ in range(n)][::-1]
    for m in modes:
        if m is not mode:
            python_dispatch._push_mode(m)
    rest = [m for m in modes if m is not mode]
    try:
        with _non_infra_flag(any(not m.is_infra_mode() for m in rest)):
            yield
    finally:
        for _ in range(torch._C._len_torch_dispatch_stack()):
            python_dispatch._pop_mode()
        for m in modes:
            python_dispatch._push_mode(m)


@contextlib.contextmanager
def with_dispatch_mode(mode: Any) -> Iterator[None]:
    """``mode`` on the dispatch stack for the block, unless it is there already."""
    n = torch._C._len_torch_dispatch_stack()
    if mode is None or any(torch._C._get_dispatch_stack_at(i) is mode for i in range(n)):
        yield
        return
    python_dispatch._push_mode(mode)
    try:
        with _non_infra_flag(True):
            yield
    finally:
        python_dispatch._pop_mode()


@contextlib.contextmanager
def _non_infra_flag(value: bool) -> Iterator[None]:
    """The module flag Dynamo reads for "a non-infra dispatch mode is on the stack", which
    ``TorchDispatchMode.__enter__``/``__exit__`` keep and a raw push or pop does not."""
    old = python_dispatch._is_in_non_infra_torch_dispatch_mode
    python_dispatch._is_in_non_infra_torch_dispatch_mode = value
    try:
        yield
    finally:
        python_dispatch._is_in_non_infra_torch_dispatch_mode = old


def packs_on_top(tracer: Any) -> bool | None:
    """Whether the tracer's saved-tensor hooks are the innermost on autograd's stack; None where
    this torch cannot say (before 2.7)."""
    top_of = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top_of is None:
        return None
    top = top_of(True)
    return top is not None and top[0] == tracer._pack


@contextlib.contextmanager
def hooks_off(tracer: Any, off: bool = True) -> Iterator[None]:
    """The tracer's module and saved-tensor hooks off (``off=False``: back on, inside a region
    where they are off), as they were at exit. Dynamo would trace them into a compiled graph;
    the compiled graph's runtime has them on again, its saved tensors being activations like any."""
    import torch.nn.modules.module as module_mod

    from xmem_engine.tracing.tracer import unpack_saved

    hooks = ((module_mod._global_forward_pre_hooks, -1, tracer._forward_pre),
             (module_mod._global_forward_hooks, -2, tracer._forward_post))
    changed = []
    for d, key, fn in hooks:
        present = [k for k, v in d.items() if v == fn]
        if off:
            for k in present:
                changed.append((d, k, d.pop(k), True))
        elif not present:
            d[key] = fn
            changed.append((d, key, fn, False))
    mine = packs_on_top(tracer)
    if mine is None:  # torch < 2.7 cannot say: the tracer's hooks are taken to be the innermost
        mine = off
    if off and mine:
        torch._C._autograd._pop_saved_tensors_default_hooks()
    elif not off and not mine:
        torch._C._autograd._push_saved_tensors_default_hooks(tracer._pack, unpack_saved)
    graph, shown = torch.autograd.graph, torch.autograd.graph.disable_saved_tensors_hooks
    if off:  # torch's own for Dynamo (saved_hooks_yielding), the tracer's set aside
        _SET_ASIDE.append(shown)
        graph.disable_saved_tensors_hooks = getattr(shown, "__wrapped__", shown)
    elif _SET_ASIDE:  # Python run between graphs: the tracer's again
        graph.disable_saved_tensors_hooks = _SET_ASIDE[-1]
    try:
        yield
    finally:
        graph.disable_saved_tensors_hooks = shown
        if off:
            _SET_ASIDE.pop()
        for d, k, fn, removed in changed:
            if removed:
                d[k] = fn
            else:
                d.pop(k, None)
        if off and mine:
            torch._C._autograd._push_saved_tensors_default_hooks(tracer._pack, unpack_saved)
        elif not off and not mine:
            torch._C._autograd._pop_saved_tensors_default_hooks()


def saved_hooks_yielding(tracer: Any, disable: Callable[[str], Any]) -> Callable[[str], Any]:
    """``torch.autograd.graph.disable_saved_tensors_hooks`` that first takes the tracer's own
    saved-tensor hooks off the stack, and puts them back after: ``torch.func``'s ``grad``, ``vjp``
    and ``jacrev`` run under it and refuse any hook ("don't yet support saved tensor hooks"), so
    per-sample gradients (``vmap(grad(loss))``) stopped the script; a GPU run has no such hook.
    (Tensors saved inside the transform are then not marked as activations; their memory is
    traced as any.) Inside a compiled call :func:`hooks_off` puts the original back: Dynamo knows
    it by identity, and took this one for an unsupported call (a graph break)."""
    from xmem_engine.tracing.tracer import unpack_saved

    @contextlib.contextmanager
    def disable_saved_tensors_hooks(error_message: str) -> Iterator[None]:
        mine = bool(packs_on_top(tracer))
        if mine:
            torch._C._autograd._pop_saved_tensors_default_hooks()
        try:
            with disable(error_message):
                yield
        finally:
            if mine:
                torch._C._autograd._push_saved_tensors_default_hooks(tracer._pack, unpack_saved)

    disable_saved_tensors_hooks.__wrapped__ = disable  # type: ignore[attr-defined]  # what hooks_off shows Dynamo
    return disable_saved_tensors_hooks


def dynamo_skips_the_tracer() -> None:
    """Dynamo never compiles the tracer's own handlers. Where it skips a frame it runs the frame
    eagerly with its callback on, and would take the next Python frame for a new entry: under a
    skipped frame (torch 2.10 skips ``nn.Linear``'s ``_call_impl`` and ``forward``) that is the
    tracer's dispatch handler or ``FakeTensor.device``, which it cannot trace; under torch's
    ``autocast`` decorator (accelerate's bf16 ``forward``), the autocast region's ``__enter__``
    and CUDA's cast policy (the ``AutocastCPU`` kernels, ``autocast_policy.py``)."""
    try:
        from torch._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy
    except ImportError:  # an older torch: no per-code strategy; nothing to do
        return
    from xmem_engine.tracing import alloc_mode, device_mode, virtual_cuda
    from xmem_engine.tracing.kernels.autocast_policy import CudaAutocastPolicy
    from xmem_engine.tracing.tracer import Tracer

    skip = FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP)  # this frame and all it calls
    codes = [alloc_mode.AllocMode.__torch_dispatch__.__code__, device_mode.DeviceMode.__torch_function__.__code__]
    codes += [c for c in device_mode.fake_device_property.__code__.co_consts if getattr(c, "co_name", "") == "device"]
    codes += [c for f in (virtual_cuda.autocast_methods, CudaAutocastPolicy.kernel)  # (their nested functions)
              for c in f.__code__.co_consts if isinstance(c, types.CodeType)]
    # autograd's engine as the tracer wraps it, where a function compiled whole calls ``backward()``
    # at a graph break: the wrapper and its bookkeeping are skipped, the engine's frames Dynamo's to decide
    codes += [device_mode.DeviceMode.on_stack.__code__, Tracer.backward_phase.__wrapped__.__code__]
    for code in codes:
        set_code_exec_strategy(code, skip)
    for c in device_mode.DeviceMode.in_backward_engine.__code__.co_consts:
        if getattr(c, "co_name", "") == "run":
            set_code_exec_strategy(c, FrameExecStrategy(FrameAction.SKIP, FrameAction.DEFAULT))
