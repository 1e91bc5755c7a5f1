"""The largest batch size that fits: doubling, then bisection, over any function that builds an
estimate for a value (``estimate.py`` re-exports it; the widget, ``--max-batch`` and sweeps use it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

Estimate = Any  # an estimate.Estimate, or anything with .fits, .fits_safely, .peak_allocated_bytes, .mode

SEARCH_LIMIT = 1 << 40  # far above any GPU: a variable that still fits there does not bound memory
REAL_MODE_REACH = 16  # a real-mode search goes at most this far above its start: real CPU tensors
BRACKET_REACH = 64  # the guessed second trace goes at most this far above the first
MAX_FAMILIES = 4  # families of traces a search fits before it traces every value it tries


@dataclass
class BatchSearch:
    """The answer of :func:`max_batch`. Unpacks as ``(value, estimate)``.

    ``value``: the largest value that fits (0: not even 1). When nothing above it was found
    not to fit, ``unbounded`` says why: ``"independent"`` (the peak did not change over two
    doublings, or hardly over three: memory does not depend on the variable, :func:`_flat`)
    or ``"limit"`` (the search stopped at ``limit`` with the step still fitting); ``value`` is
    then a lower bound.
    """

    value: int
    estimate: Any  # the Estimate at ``value`` (or at 1 when nothing fits)
    unbounded: str = ""  # "", "independent" or "limit"
    limit: int = SEARCH_LIMIT
    tried: list[int] = field(default_factory=list)
    traced: list[int] = field(default_factory=list)  # the values traced for real (the rest: by the family)
    family: str = ""  # how the family of traces went (batch_family.py): "" where none was tried

    def __iter__(self):
        return iter((self.value, self.estimate))

    def to_json(self) -> dict:
        """The search's part of ``xmem estimate --max-batch --json``."""
        return {"max_value": self.value if not self.unbounded else None, "at_least": self.value,
                "unbounded": self.unbounded or None, "search_limit": self.limit, "tried": self.tried,
                "traced": self.traced, "family": self.family or None}

    def answer(self) -> str:
        """The value as a reader should take it: "512", "at least 4096", or "any"."""
        return {"limit": f"at least {self.value}", "independent": "any"}.get(self.unbounded, str(self.value))

    def describe(self, variable: str, gpu_name: str) -> str:
        """One sentence for the CLI and the widget."""
        if self.unbounded == "independent":
            vals = ", ".join(str(v) for v in sorted(self.tried)[-3:])
            return (f"{variable} does not change the step's memory on {gpu_name} (the peak at {vals} stays within "
                    f"{FLAT_SPREAD:.0%}, as when the batch is larger than the dataset): it fits at any {variable}")
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
    estimate_trace: Callable[[Any], Estimate] | None = None,
    symbolic: Callable[[int], Any] | None = None,
    fit_family: bool = True,
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

    ``estimate_trace`` (a trace -> its estimate, for the same GPU and settings as ``build``):
    the second value traced is a guess just past the answer (``_bracket``: the per-sample
    bytes at ``start``'s peak against the room left), and every other value the search tries
    is estimated from the two traces' family (``batch_family.py``), no code run. An answer
    between the two (it and the value above it) is the family's: two traces in all. An answer
    outside them is traced for real, and the value above it, and they must be the family's,
    request for request, or a family is fitted there, or the search starts over with real
    traces only (``BatchSearch.family`` says which happened).

    ``symbolic`` (a value -> ``batch_family.symbolic_family`` of the script at it), with
    ``estimate_trace``: first, one trace with the variable as a symbol, which gives every value
    its guards allow (one trace in all where the step does not branch on the value); a value
    outside them gets a symbolic trace of its own. Where the first cannot be made symbolic,
    the two-trace family above, unless ``fit_family`` is False (the code tests the value in a
    way a family cannot follow: ``batch_family.branches_on``).
    """
    real: dict[int, Estimate] = {}

    def built(v: int) -> Estimate:
        if v not in real:
            real[v] = build(v)
        return real[v]

    not_symbolic = ""
    if symbolic is not None and estimate_trace is not None:
        search = _symbolic_search(symbolic, estimate_trace, built, start, limit, safe)
        if isinstance(search, BatchSearch):
            search.traced = sorted(set(search.traced) | set(real))  # symbolic traces, and values traced as they are
            return search
        not_symbolic = search
    if estimate_trace is None or not fit_family:
        search = _search(built, start, limit, safe, real)
        search.family = not_symbolic
        return _with_real(search, real)
    from xmem_engine.batch_family import BatchFamily, NotAffine, same_trace

    family: list = []  # the family in use
    pair: list[int] = []  # the two values to fit it on: the first two traced, then two at a miss
    dropped: list[str] = [not_symbolic] if not_symbolic else []
    tried: set[tuple[int, ...]] = set()

    def fit() -> None:
        a, b = pair
        if real[a].trace is None or real[b].trace is None or "fake" != real[a].trace.mode:
            dropped.append(f"{a} and {b} were not traced in fake mode")
            return
        try:
            family.append(BatchFamily.fit(a, real[a].trace, b, real[b].trace))
        except NotAffine as e:
            dropped.append(f"{a} and {b} are not one family ({e})")

    def guessed(v: int) -> Estimate:
        if v in real:
            return real[v]
        if not family and len(real) >= 2 and len(tried) < MAX_FAMILIES:
            last = tuple(list(real)[-2:])  # the two values traced last (the first two, to begin with)
            if last not in tried:
                tried.add(last)
                pair[:] = last
                fit()
        trace = family[0].trace_at(v) if family else None
        return built(v) if trace is None else estimate_trace(trace)

    # the second trace where the answer should be, just past it: the family then reaches the
    # answer between two real traces (the first two values doubling would try, else)
    other = _bracket(built(max(1, min(start, limit))), max(1, min(start, limit)), limit)
    if other is not None:
        built(other)
        pair[:] = [max(1, min(start, limit)), other]
        tried.add(tuple(pair))
        fit()
    search = _search(guessed, start, limit, safe, {})
    for _ in range(MAX_FAMILIES):
        if not family:
            break
        ends = [search.value] + ([search.value + 1] if not search.unbounded and search.value < limit else [])
        if all(min(pair) <= v <= max(pair) for v in ends):
            # between two real traces of one family: every op matched at both, sizes affine
            search.family = "; ".join(dropped + [f"fitted on {min(pair)} and {max(pair)}: the answer between them"])
            return _with_real(search, real)
        wrong = next((v for v in ends if v >= 1 and v not in real
                      and not same_trace(built(v).trace, family[0].trace_at(v))), None)
        if wrong is None:
            search.family = "; ".join(dropped + [f"fitted on {pair[0]} and {pair[1]}, checked at "
                                                 f"{', '.join(map(str, ends))}"])
            return _with_real(search, real)
        # the step changes with the batch between the family's values and this one (a kernel
        # chosen by size): a family fitted where the answer is, on this value and the next
        dropped.append(f"the family of {pair[0]} and {pair[1]} is not the real trace at {wrong}")
        family.clear()
        pair[:] = [wrong, wrong + 1 if wrong < limit else wrong - 1]
        built(pair[1])
        tried.add(tuple(pair))
        fit()
        search = _search(guessed, wrong, limit, safe, {})  # from where the answer was found
    search = _search(built, start, limit, safe, real)
    search.family = "; ".join(dropped)
    return _with_real(search, real)


def _symbolic_search(symbolic: Callable[[int], Any], estimate_trace: Callable[[Any], Estimate],
                     built: Callable[[int], Estimate], start: int, limit: int, safe: bool) -> BatchSearch | str:
    """:func:`max_batch` over symbolic traces (``batch_family.SymbolicRegions``): the value
    first traced holds every value its guards allow, and a value outside them is traced (as a
    symbol) where it is; a value that cannot be made symbolic is traced as it is (``built``).
    Returns why not, as text, where the first trace could not be made symbolic."""
    from xmem_engine.batch_family import NotSymbolic, SymbolicRegions

    regions = SymbolicRegions(symbolic)
    first = max(2, min(start, limit))  # sizes 0 and 1 are specialised: a symbol starts at 2
    try:
        regions.trace_at(first)
    except NotSymbolic as e:
        return f"the batch could not be a symbol ({e})"
    cache: dict[int, Estimate] = {}

    def estimated(v: int) -> Estimate:
        if v not in cache:
            try:
                cache[v] = estimate_trace(regions.trace_at(v))
            except NotSymbolic:
                cache[v] = built(v)
        return cache[v]

    search = _search(estimated, start, limit, safe, {})
    search.family = regions.describe()
    search.traced = regions.traced
    search.estimate = estimated(max(search.value, 1))
    return search


#: how far apart the peaks of three doublings may be and still be one peak, where one of the
#: doublings did not raise it (:func:`_flat`)
FLAT_SPREAD = 0.05


def _flat(peaks: list[Any]) -> bool:
    """The last doublings left the peak where it was: two in a row with one peak, or three
    whose peaks are within :data:`FLAT_SPREAD` of each other, one of which did not raise it.
    The second is a batch larger than the data (a 32-row dataset at batch 64, 128, 256): each
    batch is all of it, its rows paired or padded a little differently, and the search had
    doubled to its limit (40 traces) on peaks that went 6.21, 6.09, 6.21, 6.29 GB. Memory that
    follows the batch, however little of it per sample, rises at every doubling."""
    if None in peaks[-3:]:
        return False
    if len(peaks) >= 3 and len(set(peaks[-3:])) == 1:
        return True
    last = peaks[-4:]
    if len(last) < 4 or None in last:
        return False
    return (max(last) - min(last) <= FLAT_SPREAD * min(last)
            and any(b <= a for a, b in zip(last, last[1:])))


#: the categories that grow with the batch (the others: the model's and optimizer's, fixed)
PER_SAMPLE = ("activation", "temporary", "input")


def _bracket(first: Estimate, start: int, limit: int) -> int | None:
    """A batch size just past the answer, guessed from the estimate at ``start``: the bytes
    live at its peak that grow with the batch (``PER_SAMPLE``) per sample, against the room
    left under the allocator's limit; a fifth further, so that the guess brackets the answer
    when it is a little short. None where the estimate cannot say (no breakdown, nothing that
    grows, not traced in fake mode)."""
    if getattr(first, "mode", None) != "fake" or not getattr(first, "breakdown", None):
        return None
    per_sample = sum(first.breakdown.get(c, 0) for c in PER_SAMPLE) / start
    room = getattr(first, "allocator_limit_bytes", 0) - getattr(first, "peak_reserved_bytes", 0)
    if per_sample <= 0 or not getattr(first, "allocator_limit_bytes", 0):
        return None
    guess = start + room / per_sample
    other = int(guess * 1.2) + 1 if room >= 0 else int(guess * 0.8)
    other = max(1, min(other, limit, start * BRACKET_REACH))
    return other if other != start else None


def _with_real(search: BatchSearch, real: dict[int, Estimate]) -> BatchSearch:
    search.traced = sorted(real)
    if search.value in real:
        search.estimate = real[search.value]
    return search


def _search(build: Callable[[int], Estimate], start: int, limit: int, safe: bool,
            seen: dict[int, Estimate]) -> BatchSearch:
    """Doubling (or halving) from ``start``, then bisection (:func:`max_batch`)."""
    cache: dict[int, Estimate] = dict(seen)

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
        peaks = [peak(v)]  # along the doublings
        while hi is None:
            nxt = min(lo * 2, limit)
            if nxt == lo:
                return result(lo, "limit")
            if fits(nxt):
                lo = nxt
                peaks.append(peak(nxt))
                if _flat(peaks):
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
