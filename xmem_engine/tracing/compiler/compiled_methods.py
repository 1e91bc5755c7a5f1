"""``torch.compile`` as Lightning uses it: a compiled module's other methods, and the line that
compiled when ``torch.compile`` itself is wrapped.

Lightning's ``Trainer.fit`` takes a compiled ``LightningModule`` apart (``from_compiled``) and
applies the ``OptimizedModule``'s Dynamo context to ``training_step`` and the other ``*_step``
methods; importing ``lightning`` wraps ``torch.compile`` to keep each call's arguments.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Callable

import torch


class MethodsCompiled:
    """An ``OptimizedModule``'s ``dynamo_ctx`` whose compiled functions are compiled calls
    (``CompiledCalls.calls``). Left bare, Lightning's ``training_step`` was compiled for the CPU
    that the traced tensors live on, and its CPU kernel ran on a fake tensor (SIGSEGV)."""

    def __init__(self, calls: Any, ctx: Any, where: str):  # calls: torch_compile.CompiledCalls
        self.calls, self.ctx, self.where = calls, ctx, where

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        compiled = self.calls.calls(self.ctx(fn), fn, self.where)
        owner = getattr(fn, "__self__", None)
        if isinstance(owner, torch.nn.Module) and getattr(fn, "__name__", "") != "forward":
            compiled = as_module_call(self.calls.t, owner, compiled)
        return functools.wraps(fn)(compiled)

    def __getattr__(self, name: str) -> Any:  # fullgraph, callback, _hooks: the context's
        return getattr(self.__dict__["ctx"], name)

    def __deepcopy__(self, memo: dict) -> MethodsCompiled:
        """Itself: it holds the trace (as ``VirtualGPUBackend`` does)."""
        return self


def as_module_call(tracer: Any, module: torch.nn.Module, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, a method of ``module`` other than ``forward``, told to the tracer as a call of the
    module: a compiled ``training_step`` is the step's forward (inside it the tracer's module hooks
    are off, as Dynamo would trace them), or its allocations had no step and no phase."""
    import torch.nn.modules.module as module_mod

    def call(*args: Any, **kwargs: Any) -> Any:
        if tracer._forward_pre not in module_mod._global_forward_pre_hooks.values():
            return fn(*args, **kwargs)  # inside a compiled call: the hooks are off
        tracer._forward_pre(module, args)
        try:
            return fn(*args, **kwargs)
        finally:
            tracer._forward_post(module, args, None)

    return call


def compile_wrappers() -> frozenset[types.CodeType]:
    """The code of the functions that wrap ``torch.compile`` now (Lightning's ``_capture``): the
    line a compile is named by is their caller's, the user's, not theirs."""
    out: set[types.CodeType] = set()
    fn: Any = torch.compile
    while hasattr(fn, "__wrapped__") and hasattr(fn, "__code__"):
        out.add(fn.__code__)
        fn = fn.__wrapped__
    return frozenset(out)
