"""Which ops xmem models, and how: one registry every rule table registers into.

Each rule stays in the table of its module, where the tracer looks it up on every op (a dict
lookup); the module registers the table here when it is imported (``import xmem_engine.tracing``
imports them all), as ``torch/utils/flop_counter.py``'s ``register_flop_formula`` collects
flop formulas, so that "which ops are modelled?" has one answer: :func:`rules`, and
``xmem ops`` on the command line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

#: kind -> what a rule of that kind does (``xmem ops`` prints these)
KINDS: dict[str, str] = {
    "cuda temporaries": "buffers the CUDA kernel allocates for itself through the caching allocator "
                        "(reductions' staging buffers, index_put's sort, a strided input's copy)",
    "in-place backward": "backward's scatter into a gradient, kept in place as CUDA's autograd does it",
    "cudnn convolution": "the cuDNN problem recorded, for the target GPU's convolution workspace",
    "autocast": "CUDA's autocast cast list (lower precision, fp32, promote), applied on the CPU",
    "fake fast path": "outputs stated directly in fake mode (FakeTensorMode's result, faster)",
    "size bound": "a size that depends on values, at its upper bound",
    "sparse entries": "a sparse COO tensor made with its indices and values (fake tensors' meta kernels keep none)",
    "guessed value": "a value fake tensors do not have, guessed (a reduction of ones, no id matching)",
    "known value": "computed on the real values fake mode keeps for small tensors",
    "host output": "outputs that stay on the host although the op ran on the GPU",
    "meta kernel": "a meta kernel for an overload torch ships without one",
    "cuda composite": "a library op whose CUDA implementation allocates what its CPU one does not",
    "cuda dtype": "an op whose CUDA kernel takes a dtype its CPU kernel refuses (integer histc), computed "
                  "through one the CPU takes",
    "torch function": "a torch function the virtual GPU runs as CUDA would (attention backend, dropout's "
                      "mask, einsum's lowering, values read from fake tensors)",
}


@dataclass(frozen=True)
class Rule:
    """One op's rule: the op (``aten._softmax.default``, ``torch.nn.functional.dropout``), its
    kind (:data:`KINDS`), the rule's name in its table and the module that holds it."""

    op: str
    kind: str
    rule: str
    module: str


_RULES: dict[tuple[str, str], Rule] = {}


def op_label(op: Any) -> str:
    """An op as ``xmem ops`` names it: ``aten._softmax.default``, ``torch.Tensor.item``."""
    if isinstance(op, str):  # "aten::x", "aten.x.default", "x.out", "x" (aten's own)
        if "::" in op:
            return op.replace("::", ".", 1)
        return op if op.split(".")[0] in ("aten", "prims", "torch", "bitsandbytes") else f"aten.{op}"
    if hasattr(op, "_schema"):  # an OpOverload
        return str(op)
    name = getattr(op, "__qualname__", None) or getattr(op, "__name__", None)
    module = getattr(op, "__module__", None)
    if name and module:
        return f"{'torch' if module.startswith('torch._C') else module}.{name}"
    return str(op)


def _rule_name(value: Any) -> str:
    if callable(value):
        name = getattr(value, "__qualname__", None) or getattr(value, "__name__", "") or type(value).__name__
        return "" if "<lambda>" in name else name.replace(".<locals>.", ":")
    return "" if value is None or isinstance(value, (bool, frozenset, set)) else str(value)


def register(kind: str, table: Any, module: str) -> Any:
    """Record every op of ``table`` (a dict of op -> rule, or a collection of ops) as modelled by
    ``module`` under ``kind``; returns ``table``, so a module can write
    ``RULES = register("cuda temporaries", {...}, __name__)``."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind of rule {kind!r}; one of {sorted(KINDS)}")
    items: Iterable[tuple[Any, Any]] = table.items() if isinstance(table, dict) else ((op, None) for op in table)
    for op, value in items:
        label = op_label(op)
        _RULES[(label, kind)] = Rule(label, kind, _rule_name(value), module)
    return table


def rules(kind: str | None = None) -> list[Rule]:
    """Every registered rule (of ``kind``), sorted by op then kind. A table registers when its
    module is imported: ``import xmem_engine.tracing`` imports them all."""
    return sorted((r for r in _RULES.values() if kind is None or r.kind == kind), key=lambda r: (r.op, r.kind))
