"""The training step repeated in simulation until the allocator's cache settles.

``%%xmem`` runs a cell's training step twice (``tracing/steady.py``): the second step sees the
optimizer's state and a warm cache. Most caches have settled by then; some settle a step later
(the test MLP of ``tests/tracing/test_steady_state.py`` reserves 1 GiB more in step 3 than in step 2, and
nothing more after), and the two-step figure was that much low. Tracing a third step costs a
third more time; its requests, though, are the second step's: same program, same shapes. So
the second pass's requests are appended again, here, as the third step's (and the fourth's, ...),
each object carried from one step into the next (the previous batch, the loss) freed where the
second step freed its predecessor, until reserved memory stops growing. What differs between
the steps is then the allocator's state alone, which is what the simulator models.

A pass whose carried objects cannot be paired with the previous pass's by their size, op and
category (the step is not periodic) is not repeated.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from xmem_engine.trace import ALLOC, FREE, RECORD_STREAM, TraceEvent

#: the most steps added in simulation (the cache has settled long before, where it settles)
MAX_EXTRA_STEPS = 4


def _signature(e: TraceEvent) -> tuple:
    return (e.bytes, e.op, str(e.category), e.module, e.dtype, tuple(e.shape), e.stream)


def _later(e: TraceEvent, k: int, **changes: int) -> TraceEvent:
    """``e`` as the ``k``-th repeat of its pass makes it: its iteration ``k`` later."""
    return replace(e, iteration=e.iteration + k if e.iteration >= 0 else e.iteration, **changes)


def repeated(events: list[TraceEvent], start: int, end: int, times: int) -> list[TraceEvent] | None:
    """``events`` with ``events[start:end]`` (one whole pass over the step) run ``times`` more
    times after it; None where the pass is not periodic (module docstring)."""
    body = events[start:end]
    allocated_before = {}  # id -> alloc event, live when the pass starts
    for e in events[:start]:
        if e.kind == ALLOC:
            allocated_before[e.id] = e
        elif e.kind == FREE:
            allocated_before.pop(e.id, None)
    inside = {e.id for e in body if e.kind == ALLOC}
    freed_inside = {e.id for e in body if e.kind == FREE}
    carried_in = [allocated_before[e.id] for e in body if e.kind == FREE and e.id in allocated_before]
    left_live = [e for e in body if e.kind == ALLOC and e.id not in freed_inside]
    # each object freed in the pass but made before it stands for one the pass leaves live
    successor: dict[int, int] = {}
    pool = list(left_live)
    for old in carried_in:
        match = next((i for i, cand in enumerate(pool) if _signature(cand) == _signature(old)), None)
        if match is None:
            return None
        successor[old.id] = pool.pop(match).id
    next_id = max((e.id for e in events), default=0) + 1
    out = list(events[:end])
    previous: dict[int, int] = {}  # this pass's objects -> the ids the last repeat gave them
    carry = dict(successor)  # carried-in id -> the object the last pass left in its place
    for k in range(1, times + 1):
        fresh: dict[int, int] = {}
        for e in body:
            if e.kind == ALLOC:
                fresh[e.id] = next_id
                next_id += 1
                out.append(_later(e, k, id=fresh[e.id]))
            elif e.kind in (FREE, RECORD_STREAM) and e.id >= 0:
                target = fresh.get(e.id) if e.id in inside else carry.get(e.id)
                if target is None:  # freed before it was made in this pass: not periodic
                    return None
                out.append(replace(e, id=target))
            else:
                out.append(_later(e, k))
        carry = {old: fresh[new] for old, new in successor.items()}
        previous = fresh
    out.extend(events[end:])
    # the objects the last repeat left live are freed where the traced ones were (the code's end)
    for i in range(end + len(body) * times, len(out)):
        e = out[i]
        if e.kind in (FREE, RECORD_STREAM) and e.id in previous:
            out[i] = replace(e, id=previous[e.id])
    return out


def settled(events: list[TraceEvent], start: int, end: int, peak_reserved: Callable[[list[TraceEvent]], int],
            base: int | None = None) -> tuple[list[TraceEvent], int, int]:
    """The events with the pass repeated until ``peak_reserved`` of them stops growing (at most
    :data:`MAX_EXTRA_STEPS` more): (events, steps added, bytes the peak grew). Unchanged events
    and (0, 0) where one more step changes nothing or the pass is not periodic. ``base``: the
    events' own peak, where the caller has it."""
    base = peak_reserved(events) if base is None else base
    best, added, grown = events, 0, 0
    for times in range(1, MAX_EXTRA_STEPS + 1):
        more = repeated(events, start, end, times)
        if more is None:
            break
        peak = peak_reserved(more)
        if peak <= base + grown:
            break
        best, added, grown = more, times, peak - base
    return best, added, grown
