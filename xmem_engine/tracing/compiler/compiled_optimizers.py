"""Optimizers under ``torch.compile``, as a GPU runs them (PyTorch's recipe "Compiling the
optimizer with torch.compile": ``@torch.compile def fn(): opt.step()``).

- Dynamo traces ``opt.step`` and, in it, the global step hooks. The tracer's hooks (phases,
  iterations, what the states hold) are Python to run, not ops to compile: while compiling is
  installed they are ``torch._dynamo.disable``\\d, so Dynamo breaks its graph around them and
  calls them (Dynamo had traced the tracer's own ``_upgrade`` until its recompile limit).
- Dynamo makes the optimizer's state while it traces (its ``OptimizerVariable`` runs
  ``_init_group`` for real, so the graph takes the states as static inputs): on the GPU those
  zeros are allocated then, before the graph runs. Dynamo traces with every dispatch mode off,
  so the step had been estimated without its optimizer state, and a state made with
  ``device=p.device`` rather than from its parameter (``capturable``'s ``step``) asked the real
  driver ("Found no NVIDIA driver"). :func:`states_made_on_the_virtual_gpu` runs that call
  under the tracer's modes, and turns ``capturable`` on where Dynamo does on a GPU.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

from xmem_engine.trace import Category
from xmem_engine.tracing.scope import CallScope


#: in the reason of the graph breaks Dynamo makes at the tracer's hooks (not the user's: not noted)
HOOK_BREAK = "xmem's tracer hook: run by Python"


@contextlib.contextmanager
def hooks_run_by_python(tracer: Any) -> Iterator[None]:
    """The tracer's global optimizer-step hooks, Dynamo-disabled for the block."""
    import torch.optim.optimizer as optim_mod

    changed = []
    for hooks, fn in ((optim_mod._global_optimizer_pre_hooks, tracer._optimizer_pre),
                      (optim_mod._global_optimizer_post_hooks, tracer._optimizer_post)):
        for key, value in list(hooks.items()):
            if value == fn:
                hooks[key] = _run_by_python(fn)
                changed.append((hooks, key, value))
    try:
        yield
    finally:
        for hooks, key, value in changed:
            if key in hooks:
                hooks[key] = value


def _run_by_python(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` Dynamo-disabled, its graph break's reason holding :data:`HOOK_BREAK`. Dynamo before
    torch 2.7 (the kk recording's 2.6) takes no reason and names the function in the break: there
    the function is named so."""
    try:
        return torch._dynamo.disable(fn, reason=HOOK_BREAK)
    except TypeError:
        def hook(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        hook.__name__ = hook.__qualname__ = HOOK_BREAK
        return torch._dynamo.disable(hook)


@contextlib.contextmanager
def states_made_on_the_virtual_gpu(tracer: Any, modes: Callable[[], tuple[Any, Any]]) -> Iterator[None]:
    """What Dynamo's ``OptimizerVariable`` does for real to a tracer optimizer, as on the GPU:
    ``_init_group`` and ``move_step_if_cpu`` run with the tracer's fake mode and dispatch mode
    back on (Dynamo has every mode off), their allocations counted as optimizer state (the
    dispatch mode places ``cuda`` factories on the virtual GPU: ``AllocMode._between_graphs``);
    and ``capturable`` is turned on where Dynamo turns it on for GPU parameters (``p.is_cuda``,
    which the tracer's CPU fakes answer False to C++). ``modes()``: (fake mode or None,
    dispatch mode or None)."""
    from torch._dynamo.variables.optimizer import OptimizerVariable

    from xmem_engine.tracing.compiler.mode_stacks import with_dispatch_mode

    real = {name: getattr(OptimizerVariable, name, None)
            for name in ("call_method", "move_step_if_cpu", "_set_capturable")}

    def ours(opt: Any) -> bool:
        return modes()[1] is not None and opt in tracer._optimizers

    @contextlib.contextmanager
    def under_tracer() -> Iterator[None]:
        fake, dispatch = modes()
        saved, tracer.scope = tracer.scope, CallScope(category=Category.OPTIMIZER_STATE)
        try:
            with (fake if fake is not None else contextlib.nullcontext()), with_dispatch_mode(dispatch):
                yield
        finally:
            tracer.scope = saved

    def call_method(self: Any, tx: Any, name: str, args: Any, kwargs: Any) -> Any:
        opt = self.value
        if name != "_init_group" or not ours(opt):
            return real["call_method"](self, tx, name, args, kwargs)
        init = opt._init_group

        def init_group(*a: Any, **k: Any) -> Any:
            with under_tracer():
                return init(*a, **k)

        opt._init_group = init_group  # what OptimizerVariable calls, for this call only
        try:
            return real["call_method"](self, tx, name, args, kwargs)
        finally:
            vars(opt).pop("_init_group", None)

    def move_step_if_cpu(self: Any) -> None:
        with under_tracer() if ours(self.value) else contextlib.nullcontext():
            real["move_step_if_cpu"](self)

    def set_capturable(self: Any, tx: Any) -> None:
        opt = self.value
        if ours(opt):
            for group in opt.param_groups:
                if "capturable" in group and all(tracer.is_gpu(p) and p not in opt.state for p in group["params"]):
                    group["capturable"] = True
        real["_set_capturable"](self, tx)

    ours_by_name = {"call_method": call_method, "move_step_if_cpu": move_step_if_cpu, "_set_capturable": set_capturable}
    for name, fn in real.items():
        if fn is not None:
            setattr(OptimizerVariable, name, ours_by_name[name])
    try:
        yield
    finally:
        for name, fn in real.items():
            if fn is not None:
                setattr(OptimizerVariable, name, fn)


def attributes_as_compile_fakes(gm: torch.nn.Module) -> None:
    """The graph module's parameters and buffers as fakes of the compile's own fake mode.
    Where Dynamo installs an optimizer's parameters as attributes of the graph (torch 2.10),
    AOTAutograd lifts them as inputs and refused the tracer's CPU fakes beside its own ("fake
    mode from tracing context doesn't match"): the graph did not compile, and ran eagerly on
    the tracer's parameters beside Dynamo's states. Only without grad (an optimizer's step):
    there no gradient can flow to the new objects. The compiled code reads no values; the
    tracer follows what it allocates."""
    from torch._guards import TracingContext
    from torch._subclasses.fake_tensor import FakeTensor

    mode = getattr(TracingContext.try_get(), "fake_mode", None)
    if mode is None or torch.is_grad_enabled():  # a graph with a backward: its parameters get the gradients
        return
    for owner in gm.modules():
        for name, t in list(owner._parameters.items()) + list(owner._buffers.items()):
            if isinstance(t, FakeTensor) and t.fake_mode is not mode:
                fake = mode.from_tensor(t, static_shapes=True)
                if name in owner._parameters:
                    owner._parameters[name] = torch.nn.Parameter(fake, requires_grad=t.requires_grad)
                else:
                    owner._buffers[name] = fake
