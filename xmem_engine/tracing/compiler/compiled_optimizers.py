"""Optimizers under ``torch.compile``, as a GPU runs them (PyTorch's recipe "Compiling the
optimizer with torch.compile": ``@torch.compile def fn(): opt.step()``).

- Dynamo traces ``opt.step`` and, in it, the global step hooks. The tracer's hooks (phases,
  iterations, what the states hold) are Python to run, not ops to compile: while compiling is
  installed they are ``torch._dynamo.disable``\\d, so Dynamo breaks its graph around them and
  calls them (Dynamo had traced the tracer's own ``_upgrade`` until its recompile limit).
- Dynamo makes the optimizer's state while it traces (its ``OptimizerVariable`` runs
  ``_init_group`` for real, so the graph takes the states as static inputs): on the GPU those
  zeros are allocated then, before the graph runs. The tracer's dispatch mode is off while
  Dynamo traces, so they are taken in as allocations when the graph reaches the backend
  (:func:`adopt_states`): the step had been estimated without its optimizer state.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from xmem_engine.trace import Category
from xmem_engine.tracing.scope import CallScope, Device


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
                hooks[key] = torch._dynamo.disable(fn, reason=HOOK_BREAK)
                changed.append((hooks, key, value))
    try:
        yield
    finally:
        for hooks, key, value in changed:
            if key in hooks:
                hooks[key] = value


def adopt_states(tracer: Any) -> int:
    """Allocations for the states of the tracer's optimizers that Dynamo made while tracing
    (tensors of a GPU parameter's state that the tracer has not seen); how many."""
    made = 0
    for opt in list(tracer._optimizers):
        for p, state in list(opt.state.items()):
            if not isinstance(state, dict) or not isinstance(p, torch.Tensor) or not tracer.is_gpu(p):
                continue
            for v in state.values():
                if isinstance(v, torch.Tensor) and v.device.type == "cuda" and not tracer.is_gpu(v):
                    _adopt(tracer, v)
                    made += 1
    return made


def _adopt(tracer: Any, t: torch.Tensor) -> None:
    st = t.untyped_storage()
    saved, tracer.scope = tracer.scope, CallScope(Device.GPU, False, None, None, Category.OPTIMIZER_STATE)
    try:
        tracer.on_new_storage("aten.zeros_like.default", t, st, st._cdata, st.nbytes())
    finally:
        tracer.scope = saved


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
