"""The largest batch size that fits: doubling, then bisection, over any function that builds an
estimate for a value (``estimate.py`` re-exports it; the widget, ``--max-batch`` and sweeps use it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

Estimate = Any  # an estimate.Estimate, or anything with .fits, .fits_safely, .peak_allocated_bytes, .mode

SEARCH_LIMIT = 1 << 40  # far above any GPU: a variable that still fits there does not bound memory
REAL_MODE_REACH = 16  # a real-mode search goes at most this far above its start: real CPU tensors


@dataclass
class BatchSearch:
    """The answer of :func:`max_batch`. Unpacks as ``(value, estimate)``.

    ``value``: the largest value that fits (0: not even 1). When nothing above it was found
    not to fit, ``unbounded`` says why: ``"independent"`` (the peak did not change over three
    doublings: memory does not depend on the variable) or ``"limit"`` (the search stopped at
    ``limit`` with the step still fitting); ``value`` is then a lower bound.
    """

    value: int
    estimate: Any  # the Estimate at ``value`` (or at 1 when nothing fits)
    unbounded: str = ""  # "", "independent" or "limit"
    limit: int = SEARCH_LIMIT
    tried: list[int] = field(default_factory=list)

    def __iter__(self):
        return iter((self.value, self.estimate))

    def answer(self) -> str:
        """The value as a reader should take it: "512", "at least 4096", or "any"."""
        return {"limit": f"at least {self.value}", "independent": "any"}.get(self.unbounded, str(self.value))

    def describe(self, variable: str, gpu_name: str) -> str:
        """One sentence for the CLI and the widget."""
        if self.unbounded == "independent":
            vals = ", ".join(str(v) for v in sorted(self.tried)[-3:])
            return (f"{variable} does not change the step's memory on {gpu_name} (the same peak at {vals}): "
                    f"it fits at any {variable}")
        if self.unbounded == "limit":
            return (f"largest {variable} that fits on {gpu_name}: {self.answer()} "
                    f"(the search stopped at its limit, {self.limit}, with the step still fitting)")
        return f"largest {variable} that fits on {gpu_name}: {self.answer()}"


def max_batch(
    build: Callable[[int], Estimate],
    *,
    start: int = 1,
    limit: int = SEARCH_LIMIT,
    safe: bool = False,
) -> BatchSearch:
    """The largest value ``v`` in [1, limit] with ``build(v).fits`` (0 if not even 1 fits);
    with ``safe``, with ``build(v).fits_safely``: the calibrated range's high end fits too.

    Memory grows with the batch, so: from ``start`` double (or halve) until the answer is
    bracketed, then bisect - about 2 log2(answer / start) estimates, each built once. A
    variable the peak does not follow (three doublings, one peak) ends the search as
    ``unbounded="independent"``; reaching ``limit`` still fitting, as ``unbounded="limit"``.
    When the estimate at ``start`` was traced in real mode, every larger value holds real CPU
    tensors: the search then goes no further than ``REAL_MODE_REACH`` times ``start``, so it
    cannot exhaust the host's memory.
    """
    cache: dict[int, Estimate] = {}

    def fits(v: int) -> bool:
        if v not in cache:
            cache[v] = build(v)
        return cache[v].fits_safely if safe else cache[v].fits

    def peak(v: int) -> Any:
        return getattr(cache[v], "peak_allocated_bytes", None)

    def result(v: int, unbounded: str = "") -> BatchSearch:
        return BatchSearch(v, cache.get(v, cache.get(1)), unbounded, limit, sorted(cache))

    v = max(1, min(start, limit))
    if fits(v):
        if getattr(cache[v], "mode", None) == "real":
            limit = min(limit, v * REAL_MODE_REACH)
        lo, hi = v, None
        same = 0  # doublings in a row that left the peak where it was
        while hi is None:
            nxt = min(lo * 2, limit)
            if nxt == lo:
                return result(lo, "limit")
            if fits(nxt):
                same = same + 1 if peak(nxt) is not None and peak(nxt) == peak(lo) else 0
                lo = nxt
                if same >= 2:
                    return result(lo, "independent")
            else:
                hi = nxt
    else:
        hi, lo = v, None
        while lo is None:
            if hi == 1:
                return result(0)
            nxt = hi // 2
            if fits(nxt):
                lo = nxt
            else:
                hi = nxt
    while hi - lo > 1:  # lo fits, hi does not
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return result(lo)
