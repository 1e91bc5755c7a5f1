"""A CUDA graph's replays made from their pattern, not run (``cuda_graph_trees.py``).

A GPU replays a captured graph without running the Python that built it: the same kernels on
the same addresses, every replay alike. Under the tracer a replay re-runs Inductor's wrapper,
which for a decode step of a 1B model is ~0.2 s of Python each new token (512 tokens of a
static-cache ``generate()``: 120 s, against 45 s for the same steps made from their pattern by
``decode_replay.py``, which cannot make a call that runs in a graph pool).

So once two real replays of a graph asked for the same requests and returned the same outputs
(:class:`ReplayForm`, compared whole), the later replays are made from that form: its requests go
to the tracer in order (the call's own allocations and frees, and the GEMMs that write into a
given buffer, for cuBLAS's workspace), the outputs are made empty with their shapes, strides and
storage sizes, or are the same views of the same inputs, and nothing else runs. A replay whose
requests the form cannot hold (it frees a tensor it was not given, keeps one that is not an
output, runs a convolution or a reduction whose staging buffers depend on the GPU) always runs.
``XMEM_REPLAY_GRAPHS=0`` runs every replay.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from xmem_engine.trace import ALLOC, FREE, TraceEvent


ENV = "XMEM_REPLAY_GRAPHS"


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


class NotMade(Exception):
    """This replay's requests cannot be made from a form (the reason says why)."""


@dataclass
class ReplayForm:
    """One replay, as the next ones are made (module docstring)."""

    rows: list  # ("A", bytes, stream, category, op, module, dtype, shape, source) | ("F", row) |
    #             ("M", op, dtype, shape, stream, module, source): a GEMM into a given buffer
    outputs: list  # per output leaf: ("new", row, shape, stride, offset, dtype) | ("input", i, ...) | ("value", v)
    spec: Any  # the outputs' pytree structure
    sdpa: int  # attention calls the replay counted

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, ReplayForm) and self.rows == other.rows and self.outputs == other.outputs
                and str(self.spec) == str(other.spec) and self.sdpa == other.sdpa)


@dataclass
class Before:
    """The tracer's records before a replay, to read what the replay added."""

    events: int
    gemms: int
    groups: int
    convs: int
    sdpa: int

    @classmethod
    def of(cls, tr: Any) -> "Before":
        return cls(len(tr.events), len(tr.gemm_into), len(tr.by_sm), len(tr.conv_calls), tr.sdpa_calls)


def input_keys(inputs: list) -> dict[int, tuple[int, torch.dtype]]:
    """Storage key -> (index, dtype) of a replay's tensor inputs, read before the call (holding the
    tensors would keep alive those the graph frees)."""
    keys: dict[int, tuple[int, torch.dtype]] = {}
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor):
            keys.setdefault(x.untyped_storage()._cdata, (i, x.dtype))
    return keys


def form_of(tr: Any, before: Before, inputs: dict[int, tuple[int, torch.dtype]], out: Any) -> ReplayForm:
    """The replay just run (from ``before``) as a form; :class:`NotMade` where it cannot be one.
    ``inputs``: :func:`input_keys` of the replay's inputs."""
    if len(tr.conv_calls) != before.convs:
        raise NotMade("it ran convolutions")
    if len(tr.by_sm) != before.groups:
        raise NotMade("it ran reductions whose staging buffers follow the GPU")
    rows: list = []
    at: dict[int, int] = {}  # alloc event id -> its row
    gemms: dict[int, list] = {}
    for g in tr.gemm_into[before.gemms:]:
        gemms.setdefault(g[0], []).append(g)
    end = len(tr.events)
    for i in range(before.events, end + 1):
        # (a GEMM's record less its phase and iteration, which are the replay's own)
        rows += [("M", g[1], g[2], tuple(g[3]), *g[5:8]) for g in gemms.get(i, ())]
        if i == end:
            break
        e = tr.events[i]
        if e.kind == ALLOC:
            at[e.id] = len(rows)
            rows.append(("A", e.bytes, e.stream, e.category, e.op, e.module, e.dtype, tuple(e.shape), e.source))
        elif e.kind == FREE and e.id in at:
            rows.append(("F", at.pop(e.id)))
        else:
            raise NotMade(f"a {e.kind} event of a tensor it was not given" if e.kind == FREE else f"a {e.kind} event")
    leaves, spec = tree_flatten(out)
    outputs: list = []
    kept: set[int] = set()
    for x in leaves:
        if not isinstance(x, torch.Tensor):
            outputs.append(("value", x))
            continue
        key = x.untyped_storage()._cdata
        rec = tr.live.get(key)
        view = (tuple(x.shape), tuple(x.stride()), x.storage_offset(), x.dtype)
        if rec is not None and rec.event is not None and rec.event.id in at:
            row = at[rec.event.id]
            if rows[row][1] % x.dtype.itemsize:
                raise NotMade("an output whose storage is not whole elements")
            kept.add(rec.event.id)
            outputs.append(("new", row, *view))
        elif key in inputs and inputs[key][1] == x.dtype:
            outputs.append(("input", inputs[key][0], *view))
        else:
            raise NotMade("an output that is neither made by the replay nor one of its inputs")
    if set(at) - kept:
        raise NotMade("it keeps a tensor that is not an output")
    return ReplayForm(rows, outputs, spec, tr.sdpa_calls - before.sdpa)


def make(tr: Any, form: ReplayForm, inputs: list, device: torch.device) -> Any:
    """The replay's requests to the tracer, and its outputs, from ``form`` (nothing runs)."""
    made: dict[int, Any] = {}  # row -> the event (freed in the replay) or the storage tensor (an output's)
    kept = {o[1] for o in form.outputs if o[0] == "new"}
    for r, row in enumerate(form.rows):
        if row[0] == "A":
            _, nbytes, stream, category, op, module, dtype, shape, source = row
            ev = TraceEvent(ALLOC, bytes=nbytes, stream=stream, category=category, op=op, module=module,
                            dtype=dtype, shape=shape, source=source)
            if r in kept:  # an output's storage: a tensor the tracer follows, its event the replay's
                base = torch.empty((nbytes,), dtype=torch.uint8, device=device)
                e = tr.live[base.untyped_storage()._cdata].event
                for name in ("category", "op", "module", "dtype", "shape", "source"):
                    setattr(e, name, getattr(ev, name))
                made[r] = base
            else:
                made[r] = tr.add_event(ev)
        elif row[0] == "F":
            a = made.pop(row[1])
            tr.add_event(TraceEvent(FREE, id=a.id, bytes=a.bytes, stream=a.stream, category=a.category, op=a.op,
                                    module=a.module, phase=tr.phase, dtype=a.dtype, shape=a.shape,
                                    iteration=tr.iteration))
        else:  # a GEMM into a given tensor (its cuBLAS workspace), as Tracer.on_gemm_into records it
            _, op, dtype, shape, stream, module, source = row
            tr.gemm_into.append([len(tr.events), op, dtype, list(shape), str(tr.phase), stream, module, source,
                                 tr.iteration])
    tr.sdpa_calls += form.sdpa
    leaves = []
    for o in form.outputs:
        if o[0] == "value":
            leaves.append(o[1])
            continue
        _, where, shape, stride, offset, dtype = o
        src = made[where] if o[0] == "new" else inputs[where]
        leaves.append(src.view(torch.uint8).view(dtype).as_strided(shape, stride, offset) if o[0] == "new"
                      else src.as_strided(shape, stride, offset))
    del made
    return tree_unflatten(leaves, form.spec)
