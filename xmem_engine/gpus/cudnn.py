"""cuDNN convolution workspaces: measured per GPU architecture, asked for as PyTorch asks.

How PyTorch runs a convolution on cuDNN (``aten/src/ATen/native/cudnn/Conv_v8.cpp``,
``run_single_conv``; the path of cuDNN 8 and 9):

* heuristics mode (``torch.backends.cudnn.benchmark`` off, the default): cuDNN ranks engine
  configs for the problem; ``try_configs`` runs them in that order, each asking the caching
  allocator for its workspace. The first whose workspace can be had runs (the allocator frees
  its cache and retries before it gives up: an out-of-memory only moves on to the next config,
  and to the fallback list after the heuristic one). The workspace is freed when the call
  returns. The chosen plan is cached per problem and tried first next time.
* benchmark mode: ``get_plans_from_find`` drops the plans whose workspace is larger than
  the largest block the allocator could hand out, allocates the largest workspace left
  (halved on out-of-memory) and times every plan, then empties the cache. That search is not
  modelled: a step run with ``cudnn.benchmark`` gets a note instead.
* depthwise convolutions in float32 (and most others not in channels-last) do not reach cuDNN
  (``ConvParams::use_cudnn_depthwise``): PyTorch's own kernels need no workspace.

Which engine config cuDNN's heuristics rank first, and so its workspace, is decided on the
GPU: a CPU cannot know it. ``benchmarks/cudnn_workspaces.py`` measures it on a GPU, per
problem (:class:`ConvProblem`: shapes, stride, padding, ..., dtype, direction), as what the
op allocates beyond its outputs; the tables live in ``xmem_engine/data/cudnn_workspaces.json``
by compute capability (cuDNN's heuristics differ by architecture). A traced convolution whose
problem is in the target GPU's table gets its workspace, allocated right after the op's output
and freed at once, and dropped when the simulated device cannot give it (the next config is
assumed to need none). Problems not in the table get none; the calibrated range
(``calibration.py``) carries what that leaves out.

``XMEM_CUDNN_WORKSPACES`` (in the estimate's environment): ``off`` adds none; a path to a JSON
file of the same format adds its tables ahead of the committed ones (a user's own GPU measured
with the benchmark script).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Mapping

from xmem_engine.gpus.catalog import GPU
from xmem_engine.trace import ALLOC, CUDNN_WORKSPACE_OP, FREE, TraceEvent

WORKSPACES_FILE = Path(__file__).resolve().parent.parent / "data" / "cudnn_workspaces.json"
ENV = "XMEM_CUDNN_WORKSPACES"
DIRECTIONS = ("forward", "backward_data", "backward_weight")
NOT_INCLUDED = (
    "not included: cuDNN convolution workspaces (cuDNN's heuristics choose the algorithm on the "
    "GPU itself, and none were measured on this GPU's architecture); on the paper's RTX 3060 runs, "
    "MnasNet and MobileNetV2 at batch 200-323 measured 11-16% above the estimate, likely for this "
    "reason, yet still ran with the allocator capped at 84-89% of that; most CNN runs showed no such gap")


class WorkspaceTableError(ValueError):
    """``XMEM_CUDNN_WORKSPACES`` names a file that is missing or is not a table of workspaces."""


@dataclass(frozen=True)
class ConvProblem:
    """One cuDNN call as its cache key sees it (``CacheKeyWrapper``: shapes, memory format,
    conv parameters, dtype, deterministic, allow_tf32) and its direction."""

    direction: str  # forward, backward_data or backward_weight
    dtype: str  # "float32", "bfloat16", ...
    input: tuple[int, ...]
    weight: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    transposed: bool
    output_padding: tuple[int, ...]
    groups: int
    channels_last: bool = False
    deterministic: bool = False
    allow_tf32: bool = True

    def key(self) -> str:
        """A stable text key (the tables' keys)."""
        j = "x".join
        return (f"{self.direction}|{self.dtype}|{j(map(str, self.input))}|{j(map(str, self.weight))}|"
                f"{j(map(str, self.stride))}|{j(map(str, self.padding))}|{j(map(str, self.dilation))}|"
                f"{'T' if self.transposed else 'N'}|{j(map(str, self.output_padding))}|{self.groups}|"
                f"{'cl' if self.channels_last else 'c'}|{'det' if self.deterministic else 'any'}|"
                f"{'tf32' if self.allow_tf32 else 'ieee'}")

    @classmethod
    def from_key(cls, key: str) -> "ConvProblem":
        """The problem a key names (ValueError saying what is wrong)."""
        parts = key.split("|")
        if len(parts) != 13:
            raise ValueError(f"not a convolution problem key (13 fields separated by '|'): {key!r}")
        d, dt, x, w, s, p, dil, t, op, g, cl, det, tf = parts
        if d not in DIRECTIONS:
            raise ValueError(f"unknown direction {d!r} in {key!r}; expected one of {DIRECTIONS}")

        def ints(text: str) -> tuple[int, ...]:
            return tuple(int(v) for v in text.split("x")) if text else ()
        try:
            return cls(d, dt, ints(x), ints(w), ints(s), ints(p), ints(dil), t == "T", ints(op), int(g),
                       cl == "cl", det == "det", tf == "tf32")
        except ValueError:
            raise ValueError(f"not a convolution problem key (a size is not an integer): {key!r}") from None


@dataclass(frozen=True)
class WorkspaceTable:
    """Workspaces measured on one GPU: problem key -> bytes the op took beyond its outputs."""

    compute_capability: tuple[int, int]
    gpu: str  # the GPU measured
    cudnn_version: int | None
    torch_version: str
    source: str  # where the figures came from, as a reader can find it
    bytes: Mapping[str, int]


def _workspace_bytes(key: str, v: object) -> int:
    """A workspace size from the file: a whole number of bytes, 0 to the largest request."""
    from xmem_engine.trace import MAX_REQUEST_BYTES

    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (float("inf"), float("-inf")) \
            or v != int(v):
        raise ValueError(f"workspace of {key!r} is {v!r}, not a whole number of bytes")
    if not 0 <= v <= MAX_REQUEST_BYTES:
        raise ValueError(f"workspace of {key!r} is {v!r} bytes: give 0 to {MAX_REQUEST_BYTES:,}")
    return int(v)


def _tables_of(path: Path) -> list[WorkspaceTable]:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else e
        raise WorkspaceTableError(f"{ENV}: cannot read cuDNN workspace tables from {path}: {why}") from None
    if not isinstance(d, dict) or not isinstance(d.get("tables"), list):
        raise WorkspaceTableError(f"{ENV}: {path}: expected a JSON object with a list of 'tables' "
                                  f"(as benchmarks/cudnn_workspaces.py measure writes)")
    out = []
    for i, t in enumerate(d["tables"]):
        try:
            if not isinstance(t, dict) or not isinstance(t.get("bytes"), dict):
                raise ValueError("expected an object whose 'bytes' maps problem keys to sizes")
            cc = tuple(int(v) for v in t["compute_capability"])
            if len(cc) != 2 or not all(0 <= v < 1000 for v in cc):
                raise ValueError(f"compute_capability {t['compute_capability']!r} is not [major, minor]")
            sizes = {str(k): _workspace_bytes(str(k), v) for k, v in t["bytes"].items()}
            for k in sizes:
                ConvProblem.from_key(k)
            out.append(WorkspaceTable((cc[0], cc[1]), str(t["gpu"]), t.get("cudnn_version"),
                                      str(t.get("torch_version", "")), str(t.get("source", path)), sizes))
        except (KeyError, TypeError, ValueError, IndexError, OverflowError) as e:
            raise WorkspaceTableError(f"{ENV}: {path}: table {i} is not a cuDNN workspace table: {e}") from None
    return out


@lru_cache(maxsize=8)
def _load(path: str, mtime: float) -> tuple[WorkspaceTable, ...]:
    return tuple(_tables_of(Path(path)))


def load_tables(path: str | Path = WORKSPACES_FILE) -> tuple[WorkspaceTable, ...]:
    """The tables in ``path`` (none when it does not exist); read again when it changes."""
    p = Path(path)
    if not p.is_file():
        return ()
    return _load(str(p), p.stat().st_mtime)


def table_for(gpu: GPU, environ: Mapping[str, str] | None = None) -> WorkspaceTable | None:
    """The table for ``gpu``'s architecture: the user's file (``XMEM_CUDNN_WORKSPACES``) first,
    then the committed one; None when none was measured on it or the setting is ``off``."""
    tables = check_setting(environ)
    cc = tuple(gpu.compute_capability)
    return next((t for t in tables if t.compute_capability == cc), None)


def check_setting(environ: Mapping[str, str] | None = None) -> tuple[WorkspaceTable, ...]:
    """The tables the setting gives (user's first); :class:`WorkspaceTableError` saying what is
    wrong with it. Commands call it before tracing, so a bad setting costs no trace."""
    env = os.environ if environ is None else environ
    setting = env.get(ENV, "").strip()
    if setting.lower() in ("off", "0", "none"):
        return ()
    if setting and not Path(setting).is_file():
        raise WorkspaceTableError(f"{ENV}: cannot read cuDNN workspace tables from {setting}: no such file "
                                  f"(give a JSON file written by benchmarks/cudnn_workspaces.py, or 'off')")
    return (load_tables(setting) if setting else ()) + load_tables()


def insert_workspaces(events: list[TraceEvent], calls: list, table: WorkspaceTable) -> tuple[list[TraceEvent], int]:
    """``events`` with each call's measured workspaces allocated and freed right after the op's
    output (``calls``: ``[output alloc id, [problem key, ...]]`` from the tracer). Returns the
    events and how many of the calls' problems the table has."""
    after: dict[int, list[int]] = {}
    found = 0
    for out_id, keys in calls:
        for k in keys:
            size = table.bytes.get(k)
            if size is None:
                continue
            found += 1
            if size > 0:
                after.setdefault(out_id, []).append(size)
    if not after:
        return events, found
    next_id = max((e.id for e in events), default=0) + 1
    out: list[TraceEvent] = []
    for e in events:
        out.append(e)
        sizes = after.get(e.id) if e.kind == ALLOC else None
        if not sizes:
            continue
        del after[e.id]  # ids are not reused, but a trace file could: only the first
        for size in sizes:  # backward: the data gradient's workspace, then the weight's
            ws = TraceEvent(ALLOC, id=next_id, bytes=size, stream=e.stream, category="workspace",
                            op=CUDNN_WORKSPACE_OP, module=e.module, phase=e.phase, dtype="uint8",
                            shape=(size,), source=e.source, iteration=e.iteration)
            next_id += 1
            out += [ws, replace(ws, kind=FREE)]
    return out, found


def describe(table: WorkspaceTable | None, found: int, total: int, benchmark: bool) -> str:
    """The estimate's note on what it holds of cuDNN's workspaces."""
    if benchmark:
        head = ("cudnn.benchmark is on: cuDNN's first call per shape times every engine with the largest "
                "workspace it can allocate, then PyTorch empties the cache; that search is not modelled")
    else:
        head = ""
    if table is None or total == 0:
        body = NOT_INCLUDED
    else:
        cudnn = f", cuDNN {table.cudnn_version}" if table.cudnn_version else ""
        body = (f"cuDNN convolution workspaces as measured on {table.gpu} (PyTorch {table.torch_version}{cudnn}) "
                f"for {found} of {total} convolution calls; the others are not included")
    return f"{head}; {body}" if head else body
