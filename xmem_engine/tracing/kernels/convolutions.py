"""Which cuDNN problems a traced step runs: recorded per call, for ``gpus/cudnn.py``.

A convolution's workspace depends on the GPU it runs on (cuDNN's heuristics choose the engine
there), so the tracer does not add it: it records each GPU convolution's problems (forward;
in backward the data and weight gradients, as ``convolution_backward``'s output mask asks)
with the id of the op's last output allocation, and the estimate adds the target GPU's
measured workspaces there. Kept in ``trace.meta["conv_calls"]``: ``[[output id, [problem
key, ...]], ...]``; ``trace.meta["cudnn_benchmark"]`` says a call ran with
``torch.backends.cudnn.benchmark`` on.

The CPU's convolution kernels also lay their outputs out differently from CUDA's: NNPACK
(batch 16 and more) returns NCHW for a channels-last input, where cuDNN returns channels-last.
:func:`as_on_cuda` gives a GPU convolution's outputs CUDA's layout (what Inductor's compiled
code asserts, and what the next ops copy or not) and the operand copies CUDA's kernels make
(``Tensor.contiguous(format)`` inside ``_convolution`` and ``cudnn_convolution*``, which no
dispatch mode sees).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from xmem_engine.gpus.cudnn import ConvProblem
from xmem_engine.tracing.kernels.conv_layout import cuda_layout
from xmem_engine.tracing.shims.subclasses import tensors_in
from xmem_engine.tracing.ops import register
from xmem_engine.tracing.symbolic import deferred

FORWARD = torch.ops.aten.convolution.default
BACKWARD = torch.ops.aten.convolution_backward.default
OPS = frozenset({FORWARD, BACKWARD})


Step = tuple[str, str, int]
_NAMES = {FORWARD: ("input", "weight", "bias", "stride", "padding", "dilation", "transposed", "output_padding",
                    "groups"),
          BACKWARD: ("grad_output", "input", "weight", "bias_sizes", "stride", "padding", "dilation", "transposed",
                     "output_padding", "groups", "output_mask")}


def _arguments(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    a = dict(zip(_NAMES[func], args))
    a.update(kwargs)
    return a


def _in(t: torch.Tensor, fmt: torch.memory_format) -> torch.Tensor:
    return t if t.is_contiguous(memory_format=fmt) else t.contiguous(memory_format=fmt)


def _copied(ts: list[Any], fmt: torch.memory_format) -> list[Step]:
    """Steps for the copies ``t.contiguous(fmt)`` makes of those operands not laid out so, held
    until the op returns."""
    steps = [("alloc", f"copy{i}", t.numel() * t.element_size())
             for i, t in enumerate(ts) if t is not None and t.numel() and not t.is_contiguous(memory_format=fmt)]
    return steps + [("free", slot, 0) for _, slot, _ in reversed(steps)]


def as_on_cuda(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple[Any, list[Step]]:
    """A GPU convolution's outputs in the layout CUDA gives them (copied where the CPU kernel's
    differ), and the operand copies CUDA makes while it runs, as transient steps
    (``Tracer.transients``): the input to ``fmt`` in ``_convolution`` / ``convolution_backward``,
    the weight in ``cudnn_convolution*``, the output gradient in ``cudnn_convolution_backward``."""
    a = _arguments(func, args, kwargs)
    x, w = a["input"], a["weight"]
    if (not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor) or x.layout != torch.strided
            or x.dim() != w.dim()):
        return out, []
    fmt = cuda_layout(x, w)
    if func is FORWARD:
        return (_in(out, fmt) if isinstance(out, torch.Tensor) else out), _copied([x, w], fmt)
    gi, gw, gb = out
    mask = a["output_mask"]
    if not (mask[0] or mask[1]):  # the bias's gradient alone: a sum of grad_output
        return out, []
    copies = [x, a["grad_output"], w if mask[0] else None]
    return (None if gi is None else _in(gi, fmt), None if gw is None else _in(gw, fmt), gb), _copied(copies, fmt)


def _ints(xs: Any, n: int) -> tuple[int, ...]:
    xs = tuple(map(int, xs))
    return xs * n if len(xs) == 1 and n > 1 else xs


def problems(func: Any, args: tuple, kwargs: dict) -> list[ConvProblem]:
    """The cuDNN problems one ``convolution`` / ``convolution_backward`` call runs."""
    a = _arguments(func, args, kwargs)
    x, w = a["input"], a["weight"]
    spatial = max(x.dim() - 2, 1)
    mask = tuple(a["output_mask"]) if func is BACKWARD else ()
    directions = ["forward"] if func is FORWARD else (
        (["backward_data"] if mask[0] else []) + (["backward_weight"] if mask[1] else []))
    cl = x.dim() in (4, 5) and not x.is_contiguous() and x.is_contiguous(
        memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    ctx = torch.backends.cudnn
    common = dict(dtype=str(x.dtype).removeprefix("torch."), input=tuple(x.shape), weight=tuple(w.shape),
                  stride=_ints(a["stride"], spatial), padding=_ints(a["padding"], spatial),
                  dilation=_ints(a["dilation"], spatial), transposed=bool(a["transposed"]),
                  output_padding=_ints(a["output_padding"], spatial), groups=int(a["groups"]), channels_last=cl,
                  deterministic=bool(ctx.deterministic or torch.are_deterministic_algorithms_enabled()),
                  allow_tf32=bool(ctx.allow_tf32))
    return [ConvProblem(direction=d, **common) for d in directions]


def _key(p: ConvProblem, input: tuple, weight: tuple) -> str:
    return dataclasses.replace(p, input=input, weight=weight).key()


def record(tracer: Any, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    """After a GPU convolution op returned: note its problems after its last output's alloc."""
    live = tracer.live
    ids = [rec.event.id for t in tensors_in(out)
           if (rec := live.get(t.untyped_storage()._cdata)) is not None and rec.event is not None]
    if not ids:  # no output allocated (empty tensors): nothing runs on cuDNN either
        return
    out_id = max(ids)  # ids grow: the last output allocated
    keys = [deferred(_key, p, p.input, p.weight) for p in problems(func, args, kwargs)]  # symbolic.py
    if keys:
        tracer.conv_calls.append([out_id, keys])
        if torch.backends.cudnn.benchmark:
            tracer.cudnn_benchmark = True


register("cudnn convolution", OPS, __name__)
