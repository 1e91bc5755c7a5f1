"""What a guess takes for the value of an op on unknown inputs, by rule (``guesses.py``).

A reduction of a big unknown tensor is taken as over all ones (``p.norm()`` of a weight, so
that Adafactor's RMS is 1, not 1/sqrt(numel)); a comparison of unknown ids with known ones as
matching none (``isin``: generation then runs to ``max_new_tokens``).
"""

from __future__ import annotations

from typing import Any, Callable

from xmem_engine.tracing.ops import register


# --------------------------------------------------------------------------- reductions of ones
def _norm(k: float, args: tuple, kwargs: dict) -> float:
    p = args[1] if len(args) > 1 and isinstance(args[1], (int, float)) else kwargs.get("ord", kwargs.get("p", 2))
    p = 2 if p is None else float(p)
    if p == 0:
        return k
    return 1.0 if p in (float("inf"), float("-inf")) else k ** (1.0 / p)


# op name -> value of the op on all-ones input, from k = input elements per output element
ONES_REDUCTIONS: dict[str, Callable[[float, tuple, dict], Any]] = {
    "aten.linalg_vector_norm.default": _norm,
    "aten.norm.Scalar": _norm,
    "aten.norm.ScalarOpt_dim": _norm,
    "aten.sum.default": lambda k, a, kw: k,
    "aten.sum.dim_IntList": lambda k, a, kw: k,
    "aten.count_nonzero.default": lambda k, a, kw: k,
    "aten.count_nonzero.dim_IntList": lambda k, a, kw: k,
    "aten.mean.default": lambda k, a, kw: 1,
    "aten.mean.dim": lambda k, a, kw: 1,
    "aten.prod.default": lambda k, a, kw: 1,
    "aten.amax.default": lambda k, a, kw: 1,
    "aten.amin.default": lambda k, a, kw: 1,
    "aten.max.default": lambda k, a, kw: 1,
    "aten.min.default": lambda k, a, kw: 1,
    "aten.var.correction": lambda k, a, kw: 0,
    "aten.std.correction": lambda k, a, kw: 0,
    "aten.any.default": lambda k, a, kw: True,
    "aten.any.dim": lambda k, a, kw: True,
    "aten.any.dims": lambda k, a, kw: True,
    "aten.all.default": lambda k, a, kw: True,
    "aten.all.dim": lambda k, a, kw: True,
    "aten.all.dims": lambda k, a, kw: True,
}


# op name -> the value of ``op(unknown ids, known ids)`` (Guesses._unequal): no id matches
def _isin(args: tuple, kwargs: dict) -> bool:
    invert = args[3] if len(args) > 3 else kwargs.get("invert", False)
    return bool(invert)


UNEQUAL: dict[str, Callable[[tuple, dict], bool]] = {
    "aten.isin.Tensor_Tensor": _isin,
    "aten.isin.Tensor_Scalar": _isin,
    "aten.isin.Scalar_Tensor": _isin,
}
# Not ``==`` / ``!=``: ``unfinished_sequences.max() == 0`` is itself an unknown integer
# compared with a known one, and "never equal" would never stop the loop.


register("guessed value", ONES_REDUCTIONS, __name__)
register("guessed value", UNEQUAL, __name__)
