"""The trace: the ordered GPU memory requests a piece of code would make.

This is the hand-off between the tracer (which runs user code on the CPU) and the
allocator simulator (which replays the requests through PyTorch's caching-allocator
rules). It is deliberately plain data: a list of :class:`TraceEvent` plus a little
metadata, serialisable to JSON lines (one event a line) so that other tools can read it.

Event kinds
-----------
``alloc``          a storage of ``bytes`` bytes is requested on ``stream`` (``id`` names it).
``free``           the storage ``id`` is released (the moment its last reference dies).
``record_stream``  storage ``id`` was used on ``streams`` (its free is deferred until those
                   streams catch up, so it returns to the pool later).
``iteration``      marker: a training iteration starts (``iteration`` holds its index).
``phase``          marker: the phase changes (``phase`` holds forward/backward/optimizer/other).
``empty_cache``    marker: the code called ``torch.cuda.empty_cache()``.
``reset_peak``     marker: the code called ``torch.cuda.reset_peak_memory_stats()``.
``synchronize``    marker: the host waited for the device (``torch.cuda.synchronize()``, an
                   event's or a stream's ``synchronize()``): frees deferred by ``record_stream``
                   complete, as the allocator finds at its next request.
``pool_begin``     requests on ``streams`` (none listed: on every stream) come from the private
                   memory pool ``id`` (a number >= 1) until its ``pool_end``: a CUDA graph's
                   capture, ``torch.cuda.use_mem_pool``, ``mode="reduce-overhead"``'s graphs.
                   The pool is made at its first begin; each later begin is one more user.
``pool_end``       requests go to the global pools again.
``pool_release``   one user of pool ``id`` is gone (a graph deleted); once none is left its
                   cached segments go at the next ``empty_cache``.

Allocation categories
---------------------
``parameter``, ``buffer``, ``gradient``, ``optimizer_state``, ``activation`` (saved for
backward), ``temporary``, ``input`` (data moved to the GPU), ``workspace`` (library
scratch such as the cuBLAS workspace; a ``cudnn.workspace`` request that does not fit is
dropped, not a failure), ``communication`` (buffers of collectives: DDP's
gradient buckets, FSDP's gather and reduce-scatter buffers), ``other``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import IO, Iterable, Iterator

class Word(str, Enum):
    """A word of the trace's vocabulary: an enum member that *is* its string, so events
    compare, hash, print and serialise to JSON exactly as the plain words they replace."""

    __str__ = str.__str__
    __format__ = str.__format__


class EventKind(Word):
    ALLOC = "alloc"
    FREE = "free"
    RECORD_STREAM = "record_stream"
    ITERATION = "iteration"
    PHASE = "phase"
    EMPTY_CACHE = "empty_cache"
    RESET_PEAK = "reset_peak"
    SYNCHRONIZE = "synchronize"
    POOL_BEGIN = "pool_begin"
    POOL_END = "pool_end"
    POOL_RELEASE = "pool_release"


class Category(Word):
    """What an allocation holds (see the module docstring)."""

    PARAMETER = "parameter"
    BUFFER = "buffer"
    GRADIENT = "gradient"
    OPTIMIZER_STATE = "optimizer_state"
    ACTIVATION = "activation"
    TEMPORARY = "temporary"
    INPUT = "input"
    WORKSPACE = "workspace"
    COMMUNICATION = "communication"
    OTHER = "other"


class Phase(Word):
    """The part of a training step an event belongs to."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    OTHER = "other"


class Mode(Word):
    """How the GPU side of the user's code runs."""

    AUTO = "auto"  # fake, then real if the code needs tensor values
    FAKE = "fake"  # FakeTensorMode: shapes and dtypes only, no host memory
    REAL = "real"  # real CPU tensors


ALLOC = EventKind.ALLOC
FREE = EventKind.FREE
RECORD_STREAM = EventKind.RECORD_STREAM
ITERATION = EventKind.ITERATION
PHASE = EventKind.PHASE
EMPTY_CACHE = EventKind.EMPTY_CACHE
RESET_PEAK = EventKind.RESET_PEAK
SYNCHRONIZE = EventKind.SYNCHRONIZE
POOL_BEGIN = EventKind.POOL_BEGIN
POOL_END = EventKind.POOL_END
POOL_RELEASE = EventKind.POOL_RELEASE
POOL_KINDS = (POOL_BEGIN.value, POOL_END.value, POOL_RELEASE.value)

EVENT_KINDS = tuple(k.value for k in EventKind)
MARKER_KINDS = (ITERATION.value, PHASE.value, EMPTY_CACHE.value, RESET_PEAK.value, SYNCHRONIZE.value) + POOL_KINDS
CATEGORIES = tuple(c.value for c in Category)
PHASES = tuple(p.value for p in Phase)
MODES = tuple(m.value for m in Mode)

# The op of a cuDNN convolution workspace (``gpus/cudnn.py``): the one request a run survives
# failing, since PyTorch then tries cuDNN's next engine config; the simulator drops it instead.
CUDNN_WORKSPACE_OP = "cudnn.workspace"

# The largest request a trace may hold: 1 PiB, far above any GPU (the simulator refuses more).
MAX_REQUEST_BYTES = 1 << 50
_INT_FIELDS = ("id", "bytes", "stream", "iteration")
_STR_FIELDS = ("category", "op", "module", "phase", "dtype", "source")


@dataclass(slots=True)
class TraceEvent:
    """One event of a trace. Fields that do not apply to a kind keep their defaults."""

    kind: str
    id: int = -1  # storage id, shared by an alloc and its free
    bytes: int = 0  # requested bytes (before the allocator rounds them)
    stream: int = 0
    category: str = ""
    op: str = ""  # aten op that created the storage, e.g. "aten.mm.default"
    module: str = ""  # module path, e.g. "encoder.layers.3.attn"
    phase: str = ""
    dtype: str = ""
    shape: tuple[int, ...] = ()
    source: str = ""  # user source "file:line"
    iteration: int = -1
    streams: tuple[int, ...] = ()  # record_stream: the streams the storage was used on

    def to_json(self) -> dict:
        d = asdict(self)
        d["shape"] = list(self.shape)
        d["streams"] = list(self.streams)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "TraceEvent":
        """One event from its JSON object, every field checked (ValueError naming the field)."""
        if not isinstance(d, dict):
            raise ValueError(f"expected a JSON object (one event), got {type(d).__name__}")
        if d.get("kind") not in EVENT_KINDS:
            raise ValueError(f"unknown trace event kind {d.get('kind')!r}; expected one of {EVENT_KINDS}")
        kind = d["kind"]
        for k in _INT_FIELDS:
            if k in d and (type(d[k]) is not int):
                raise ValueError(f"{k!r} must be a whole number, not {d[k]!r}")
        if kind in (ALLOC, FREE, RECORD_STREAM) and not (type(d.get("id")) is int and d["id"] >= 0):
            raise ValueError(f"every {kind!r} event needs an 'id' (a storage number >= 0)")
        if kind in POOL_KINDS and not (type(d.get("id")) is int and d["id"] >= 1):
            raise ValueError(f"every {kind!r} event needs an 'id' (a private pool number >= 1)")
        if kind == ALLOC and not (type(d.get("bytes")) is int and 0 <= d["bytes"] <= MAX_REQUEST_BYTES):
            raise ValueError(f"an 'alloc' event needs 'bytes' from 0 to {MAX_REQUEST_BYTES:,} (1 PiB), "
                             f"not {d.get('bytes')!r}")
        if d.get("stream", 0) < 0:
            raise ValueError(f"'stream' must be >= 0, not {d['stream']!r}")
        for k in ("shape", "streams"):
            if k in d and not (isinstance(d[k], list) and all(type(x) is int and x >= 0 for x in d[k])):
                raise ValueError(f"{k!r} must be a list of whole numbers >= 0, not {d[k]!r}")
        for k in _STR_FIELDS:
            if k in d and not isinstance(d[k], str):
                raise ValueError(f"{k!r} must be a string, not {d[k]!r}")
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        known["shape"] = tuple(known.get("shape", ()))
        known["streams"] = tuple(known.get("streams", ()))
        return cls(**known)


@dataclass
class Trace:
    """A whole trace: events in program order plus how it was made."""

    events: list[TraceEvent] = field(default_factory=list)
    mode: str = ""  # "fake" or "real"
    seconds: float = 0.0
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.events)

    def __iter__(self) -> Iterator[TraceEvent]:
        return iter(self.events)

    def write_jsonl(self, path: str | Path | IO[str]) -> None:
        """Write one JSON object a line (the format of ``xmem trace --events``)."""
        if hasattr(path, "write"):
            _write_events(path, self.events)  # type: ignore[arg-type]
            return
        with open(path, "w", encoding="utf-8") as f:
            _write_events(f, self.events)

    @classmethod
    def read_jsonl(cls, path: str | Path) -> "Trace":
        """Read a trace file; ValueError ``path:line: ...`` at the first event that is not one,
        or that allocates a live id again, or frees or records a storage that is not live."""
        events = []
        live: set[int] = set()
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    e = TraceEvent.from_json(json.loads(line))
                    if e.kind == ALLOC:
                        if e.id in live:
                            raise ValueError(f"storage id {e.id} is allocated again while still live")
                        live.add(e.id)
                    elif e.kind in (FREE, RECORD_STREAM):
                        if e.id not in live:
                            raise ValueError(f"{e.kind} of storage id {e.id}, which is not live")
                        if e.kind == FREE:
                            live.discard(e.id)
                except (ValueError, TypeError, RecursionError) as err:
                    raise ValueError(f"{path}:{lineno}: not a trace event: {err}") from None
                events.append(e)
        return cls(events=events)


def _write_events(f: IO[str], events: Iterable[TraceEvent]) -> None:
    for e in events:
        f.write(json.dumps(e.to_json(), separators=(",", ":")))
        f.write("\n")
