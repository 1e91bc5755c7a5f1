"""A small autograd engine in Python, for AOTAutograd's joint graph at compile time.

``torch.compile`` of a training step traces forward and backward together: AOTAutograd calls
``torch.autograd.grad`` on fake tensors whose device is ``cuda``. The C++ engine refuses
those on a machine without a driver, fake or not (``GraphTask::stash_current_streams`` asks
``_hasPrimaryContext(0)``: "hasPrimaryContext expects a valid device index"), so while xmem
compiles for the virtual GPU ``torch.autograd.grad`` is this engine (``torch_compile.py``).

It does what the C++ engine does for the graphs AOTAutograd traces: dependencies counted per
edge, ready nodes run in descending sequence number (the CPU ready queue's order), each
gradient checked against the node's input metadata (``validate_outputs``: summed to its shape,
cast to its dtype), custom ``Function`` nodes called through ``apply`` with their missing
gradients materialized as zeros (their gradients for arguments that were not tensors dropped, as
the C++ engine drops them by its ``is_variable_input``: :func:`installed` notes which were), and
the gradients of the requested inputs captured at their gradient edges. AOTAutograd's pre/post hooks that keep each backward node's stack trace and
sequence number for the FX graph (``setup_stacktrace_preservation_hooks``) are C++-engine
hooks; they are done here around each call. Runtime ``backward()`` never comes here: xmem's
traced tensors are CPU tensors at the C++ level, which the C++ engine runs.
"""

from __future__ import annotations

import contextlib
import heapq
import inspect
from typing import Any, Iterator, Sequence

import torch
import torch.fx.traceback as fx_traceback
from torch.autograd.graph import GradientEdge, get_gradient_edge


def _is_python_node(node: Any) -> bool:
    return hasattr(node, "_forward_cls")  # a custom autograd.Function's backward node


#: id(node) -> (node, which of its Function's arguments were tensors), for the Functions applied
#: while :func:`installed` (the C++ engine keeps this as ``PyNode``'s ``is_variable_input``)
_VARIABLE_INPUTS: dict[int, tuple[Any, list[bool]]] = {}
_RECORDING = [0]  # how many installed() blocks are open: AOTAutograd keeps the patched ``apply`` of its
# runtime Function (CompiledFunction.apply) beyond the compile, where it must only pass calls on


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """``torch.autograd.grad`` is :func:`grad` for the block, and each ``autograd.Function``
    applied notes which of its arguments were tensors. A Function's ``backward`` returns one
    gradient per argument while its node has edges for the tensors only: Dynamo's
    ``autograd_function_apply`` passes the graph's SymInts too (dynamic shapes), and the LoRA
    weights' gradients of Unsloth's fused LoRA Functions had gone to the wrong edges."""
    from torch.autograd import function as function_mod
    from torch.utils._pytree import tree_leaves

    real = vars(torch.autograd.Function)["apply"]

    def apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
        out = real.__get__(None, cls)(*args, **kwargs)  # a classmethod (torch < 2.13) or C's descriptor
        if not _RECORDING[0]:
            return out
        bound = args
        if function_mod._is_setup_context_defined(cls.setup_context):  # as Function.apply binds them
            sig = inspect.signature(cls.forward).bind(*args, **kwargs)
            sig.apply_defaults()
            bound = sig.args
        node = next((t.grad_fn for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.grad_fn is not None
                     and getattr(t.grad_fn, "_forward_cls", None) is cls), None)
        if node is not None:
            _VARIABLE_INPUTS[id(node)] = (node, [isinstance(a, torch.Tensor) for a in bound])
        return out

    before = set(_VARIABLE_INPUTS)  # a compile inside another one (a lazy backward's) keeps the outer's
    torch.autograd.Function.apply = classmethod(apply)  # type: ignore[assignment,method-assign]
    saved_grad, torch.autograd.grad = torch.autograd.grad, grad  # type: ignore[assignment]
    _RECORDING[0] += 1
    try:
        yield
    finally:
        _RECORDING[0] -= 1
        torch.autograd.Function.apply = real  # type: ignore[method-assign]
        torch.autograd.grad = saved_grad  # type: ignore[assignment]
        for key in set(_VARIABLE_INPUTS) - before:
            del _VARIABLE_INPUTS[key]


@contextlib.contextmanager
def while_dynamo_traces() -> Iterator[None]:
    """``torch.autograd.grad`` is :func:`grad` while Dynamo or AOTAutograd trace, and the C++
    engine otherwise, for the block. ``torch.func.grad`` inside a compiled function (TRL's and
    Unsloth's chunked GRPO losses) puts ``autograd.grad`` in the graph, and Dynamo runs it on its
    fake ``cuda`` tensors as it traces: the C++ engine refuses them without a driver (above).
    The compiled code's own calls at run time are on xmem's traced tensors, for the C++ engine."""
    from torch._guards import TracingContext

    cpp = torch.autograd.grad

    def dispatch(*args: Any, **kwargs: Any) -> Any:
        return (grad if TracingContext.try_get() is not None else cpp)(*args, **kwargs)

    torch.autograd.grad = dispatch  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.autograd.grad = cpp  # type: ignore[assignment]


_MARK = getattr(fx_traceback, "_mark_autograd_backward", lambda: None)  # torch 2.11+
_RESET = getattr(fx_traceback, "_reset_autograd_backward", lambda: None)


def _call(node: Any, grads: list) -> tuple:
    fx_traceback.set_stack_trace(node.metadata.get("traceback_", []))
    fx_traceback.set_grad_fn_seq_nr(node._sequence_nr())
    _MARK()
    try:
        if _is_python_node(node):
            if getattr(node, "materialize_grads", True):
                grads = [g if g is not None else torch.zeros(m.shape, dtype=m.dtype, device=m.device)
                         for g, m in zip(grads, node._input_metadata)]
            out = _per_edge(node, node.apply(*grads))
        else:
            out = node(*grads)
    finally:
        fx_traceback.reset_grad_fn_seq_nr()
        _RESET()
    return out if isinstance(out, tuple) else (out,)


def _per_edge(node: Any, out: Any) -> Any:
    """A Function's gradients as its node's edges take them: extra trailing Nones cut, and those
    for arguments that were not tensors dropped (``PyNode::apply``)."""
    noted = _VARIABLE_INPUTS.get(id(node))
    if noted is None or noted[0] is not node:
        return out
    tensors = noted[1]
    out = out if isinstance(out, tuple) else (out,)
    if len(out) > len(tensors) and all(g is None for g in out[len(tensors):]):
        out = out[:len(tensors)]
    return tuple(g for g, is_tensor in zip(out, tensors) if is_tensor)


def _validate(grad: torch.Tensor | None, node: Any, nr: int) -> torch.Tensor | None:
    """The C++ engine's ``validate_outputs``: sum to the expected shape, cast to its dtype."""
    if grad is None:
        return None
    meta = node._input_metadata[nr]
    if tuple(grad.shape) != tuple(meta.shape):
        grad = grad.sum_to_size(meta.shape)
    if grad.dtype != meta.dtype:
        grad = grad.to(meta.dtype)
    return grad


def run(roots: Sequence[GradientEdge], root_grads: Sequence[torch.Tensor], targets: Sequence[GradientEdge] | None,
        accumulate: bool = False, create_graph: bool = False) -> list:
    """Run backward from ``roots`` (with their gradients). ``targets``: the gradient edges whose
    gradients are returned (``autograd.grad``); ``accumulate``: AccumulateGrad nodes add into
    ``.grad`` (``backward``)."""
    deps: dict[int, int] = {}
    nodes: dict[int, Any] = {}
    stack = [e.node for e in roots if e.node is not None]
    for n in stack:
        nodes[id(n)] = n
    while stack:
        n = stack.pop()
        for fn, _ in n.next_functions:
            if fn is None:
                continue
            deps[id(fn)] = deps.get(id(fn), 0) + 1
            if id(fn) not in nodes:
                nodes[id(fn)] = fn
                stack.append(fn)
    capture: dict[tuple[int, int], list[int]] = {}
    needed: dict[int, bool] | None = None
    if targets is not None:
        for i, e in enumerate(targets):
            capture.setdefault((id(e.node), e.output_nr), []).append(i)
        needed = {}

        def is_needed(n: Any) -> bool:  # can reach a captured edge
            k = id(n)
            if k not in needed:
                needed[k] = False
                needed[k] = any(fn is not None and ((id(fn), nr) in capture or is_needed(fn))
                                for fn, nr in n.next_functions)
            return needed[k]

        for n in list(nodes.values()):
            is_needed(n)
    captured: list = [None] * (len(targets) if targets is not None else 0)
    buffers: dict[int, list] = {}

    def deliver(node: Any, nr: int, g: torch.Tensor | None) -> None:
        buf = buffers.setdefault(id(node), [None] * len(node._input_metadata))
        g = _validate(g, node, nr)
        if g is not None:
            buf[nr] = g if buf[nr] is None else buf[nr] + g

    for e, g in zip(roots, root_grads):
        if e.node is not None:
            deliver(e.node, e.output_nr, g)
    ready: list = []
    for n in {id(e.node): e.node for e in roots if e.node is not None}.values():
        if deps.get(id(n), 0) == 0:
            heapq.heappush(ready, (-n._sequence_nr(), id(n), n))
    with torch.set_grad_enabled(create_graph):
        while ready:
            _, _, n = heapq.heappop(ready)
            grads = buffers.pop(id(n), [None] * len(n._input_metadata))
            for nr, g in enumerate(grads):
                for i in capture.get((id(n), nr), ()):
                    captured[i] = g
            if needed is not None and not needed[id(n)]:
                continue
            if type(n).__name__ == "AccumulateGrad":
                if accumulate and grads[0] is not None:
                    v = n.variable
                    v.grad = grads[0].detach() if v.grad is None else v.grad + grads[0]
                continue
            for (fn, nr), g in zip(n.next_functions, _call(n, grads)):
                if fn is None:
                    continue
                if g is not None:
                    deliver(fn, nr, g)
                deps[id(fn)] -= 1
                if deps[id(fn)] == 0:
                    heapq.heappush(ready, (-fn._sequence_nr(), id(fn), fn))
    return captured


def _as_tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (list, tuple)) else (x,)


def grad(outputs: Any, inputs: Any, grad_outputs: Any = None, retain_graph: bool | None = None,
         create_graph: bool = False, only_inputs: bool = True, allow_unused: bool | None = None,
         is_grads_batched: bool = False, materialize_grads: bool = False) -> tuple:
    """``torch.autograd.grad``'s signature, run by :func:`run`."""
    if is_grads_batched:
        raise NotImplementedError("xmem's compile-time autograd engine does not batch gradients (is_grads_batched)")
    outputs, inputs = _as_tuple(outputs), _as_tuple(inputs)
    grad_outputs = _as_tuple(grad_outputs) if grad_outputs is not None else (None,) * len(outputs)
    grad_outputs = [torch.ones_like(o) if g is None else g for o, g in zip(outputs, grad_outputs)]
    found = run([get_gradient_edge(o) for o in outputs], grad_outputs, [get_gradient_edge(i) for i in inputs],
                create_graph=create_graph)
    if materialize_grads:
        found = [torch.zeros_like(i) if r is None else r for r, i in zip(found, inputs)]
    return tuple(found)
