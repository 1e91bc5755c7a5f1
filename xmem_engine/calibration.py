"""A calibrated range around the point estimate: how far to trust the figure.

What a CPU cannot see scatters real runs around the estimate: cuDNN's choice of convolution
algorithm and its workspace, made on the GPU; sequence lengths a data loader decides; values
fake mode had to guess. This module turns the measured error of the estimate on real GPU runs
into a range, with split-conformal prediction (Vovk et al., "Algorithmic Learning in a Random
World", 2005; Angelopoulos & Bates, "A Gentle Introduction to Conformal Prediction", 2021):

- each run gives a *score*, its measured peak minus the estimate, divided by a *scale* that
  says how large the unseen part can be for that kind of workload: the largest tensor a
  convolution reads or writes for convolutional steps (cuDNN's workspace grows with it), the
  estimate itself otherwise;
- per workload kind (:data:`KINDS`), the range's ends are the scores' ``alpha`` and
  ``1 - alpha`` conformal quantiles (the ``ceil((n + 1)(1 - alpha))``-th smallest), times the
  estimate's own scale. A kind with too few runs uses the runs of all kinds whose scores share
  its scale (the relative ones: :data:`RELATIVE_KINDS`), and says so; convolutional steps,
  scored in their own unit, get no range without their own runs.

The quantiles live in ``xmem_engine/data/calibration.json`` with the runs they came from;
``benchmarks/paper_runs.py --calibrate`` writes it and ``--loo`` checks it one model at a time
(every model's runs scored by a calibration that never saw that model).
"""

from __future__ import annotations

import json
import math
import weakref
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

from xmem_engine.gpus.cuda_libraries import CONV_OP_PREFIXES as _CONV
from xmem_engine.trace import ALLOC, Trace

if TYPE_CHECKING:
    from xmem_engine.gpus.fixed_memory import FixedMemory

CALIBRATION_FILE = Path(__file__).resolve().parent / "data" / "calibration.json"
KINDS = ("convolution", "recurrent", "attention", "other")
RELATIVE_KINDS = ("recurrent", "attention", "other")  # scored relative to the estimate: poolable
ALPHA = 0.05  # at most this share of runs above the range (and as many below)
MIN_RUNS = 20  # a kind with fewer calibration runs borrows the pooled quantiles

_RNN = ("aten.lstm", "aten.gru", "aten.rnn_tanh", "aten.rnn_relu", "aten._thnn_fused", "aten.lstm_cell",
        "aten.gru_cell", "aten._cudnn_rnn", "aten.mkldnn_rnn")
_ATTENTION = ("aten._scaled_dot_product", "aten.scaled_dot_product", "aten._softmax", "aten.softmax",
              "aten._safe_softmax")
_RNN_MODULES = ("LSTM", "GRU", "RNN", "LSTMCell", "GRUCell", "RNNCell")


#: per live trace (by id; traces are unhashable dataclasses), what the range needs of its
#: events: read once, not on every GPU switch
_SEEN: dict[int, tuple[str, int]] = {}


def _read(trace: Trace) -> tuple[str, int]:
    key = id(trace)
    if key not in _SEEN:
        _SEEN[key] = (_kind(trace), max((e.bytes for e in trace.events if e.kind == ALLOC and e.op.startswith(_CONV)),
                                        default=0))
        weakref.finalize(trace, _SEEN.pop, key, None)
    return _SEEN[key]


def workload_kind(trace: Trace) -> str:
    """The kind of step, from the ops that allocated in it: a recurrent layer, else a
    convolution, else attention (softmax or SDPA), else other."""
    return _read(trace)[0]


def _kind(trace: Trace) -> str:
    ops = {e.op for e in trace.events if e.kind == ALLOC}
    types = set((trace.meta.get("module_types") or {}).values())
    if types & set(_RNN_MODULES) or any(op.startswith(_RNN) for op in ops):
        return "recurrent"
    if any(op.startswith(_CONV) for op in ops):
        return "convolution"
    if trace.meta.get("sdpa_calls") or any(op.startswith(_ATTENTION) for op in ops):
        return "attention"
    return "other"


def scale_bytes(trace: Trace, kind: str, estimate_bytes: int) -> int:
    """What a score is measured in: for convolutions the largest tensor one allocates (cuDNN's
    workspace follows the tensors it works on), for the rest the estimate itself."""
    if kind == "convolution":
        largest = _read(trace)[1]
        if largest:
            return largest
    return max(int(estimate_bytes), 1)


def conformal_bounds(scores: Sequence[float], alpha: float = ALPHA) -> tuple[float, float]:
    """Split-conformal ends: the ``floor((n + 1) alpha)``-th and ``ceil((n + 1)(1 - alpha))``-th
    smallest scores (the extremes when ``n`` is too small for that rank)."""
    s = sorted(scores)
    if not s:
        raise ValueError("no scores to calibrate on")
    n = len(s)
    hi_rank = math.ceil((n + 1) * (1 - alpha))
    lo_rank = math.floor((n + 1) * alpha)
    return (s[lo_rank - 1] if lo_rank >= 1 else s[0], s[hi_rank - 1] if hi_rank <= n else s[-1])


@dataclass(frozen=True)
class Calibration:
    """The quantiles per kind, and where they came from."""

    bounds: dict[str, tuple[float, float]]  # kind -> (low score, high score)
    runs: dict[str, int]  # kind -> calibration runs behind its bounds ("pooled" included)
    alpha: float
    source: str  # the runs, as a reader can find them
    # leave-one-model-out check: share of runs above the high end, mean (high / estimate - 1)
    checked: dict[str, float] | None = None

    def for_kind(self, kind: str) -> tuple[tuple[float, float], str] | None:
        """(low, high) for ``kind`` and the group they come from (the kind, or "pooled": the
        relative kinds together), or None when no runs of a comparable kind were measured."""
        if kind in self.bounds:
            return self.bounds[kind], kind
        if kind in RELATIVE_KINDS and "pooled" in self.bounds:
            return self.bounds["pooled"], "pooled"
        return None

    def to_json(self) -> dict:
        return {"method": "split-conformal, scores (measured - estimate) / scale, grouped by workload kind; "
                          f"kinds with fewer than {MIN_RUNS} runs use the quantiles of the relative kinds "
                          f"{'/'.join(RELATIVE_KINDS)} pooled; convolution has its own scale and no fallback",
                "alpha": self.alpha, "source": self.source, "runs": self.runs,
                "bounds": {k: list(v) for k, v in self.bounds.items()},
                **({"checked_leave_one_model_out": self.checked} if self.checked else {})}


def calibrate(samples: Iterable[tuple[str, float]], source: str, alpha: float = ALPHA) -> Calibration:
    """A calibration from (kind, score) samples: one pair per measured run."""
    by_kind: dict[str, list[float]] = {}
    pooled: list[float] = []
    for kind, score in samples:
        by_kind.setdefault(kind, []).append(score)
        if kind in RELATIVE_KINDS:
            pooled.append(score)
    bounds, runs = {}, {}
    if pooled:
        bounds["pooled"], runs["pooled"] = conformal_bounds(pooled, alpha), len(pooled)
    for kind, scores in by_kind.items():
        if len(scores) >= MIN_RUNS:
            bounds[kind] = conformal_bounds(scores, alpha)
            runs[kind] = len(scores)
    return Calibration(bounds, runs, alpha, source)


@lru_cache(maxsize=4)
def load_calibration(path: str | Path = CALIBRATION_FILE) -> Calibration | None:
    """The committed calibration (None when the file is missing: no range is given)."""
    p = Path(path)
    if not p.is_file():
        return None
    d = json.loads(p.read_text())
    return Calibration({k: (float(v[0]), float(v[1])) for k, v in d["bounds"].items()},
                       {k: int(v) for k, v in d["runs"].items()}, float(d["alpha"]), str(d["source"]),
                       d.get("checked_leave_one_model_out"))


@dataclass(frozen=True)
class PeakRange:
    """The range around an estimate's peak device memory (bytes, CUDA context included)."""

    low_bytes: int
    high_bytes: int
    kind: str  # the workload kind the step was taken for
    group: str  # the calibration group used: the kind, or "pooled"
    runs: int  # calibration runs behind it
    alpha: float
    above_unseen: float | None = None  # measured share above the high end on models left out
    # The fixed memory not measured on the target GPU (gpus/fixed_memory.py): how much lower and
    # higher its parts may be, added to the step's calibrated spread; and which parts they are.
    fixed_below_bytes: int = 0
    fixed_above_bytes: int = 0
    unmeasured: tuple[str, ...] = ()

    @property
    def step_low_bytes(self) -> int:
        """The low end from the step's calibrated spread alone."""
        return self.low_bytes + self.fixed_below_bytes

    @property
    def step_high_bytes(self) -> int:
        """The high end from the step's calibrated spread alone."""
        return self.high_bytes - self.fixed_above_bytes

    def describe(self) -> str:
        pooled = "" if self.group == self.kind else f" of other kinds: none of {self.kind} steps"
        checked = (f"; on models it had not seen, {self.above_unseen:.1%} of runs measured above it"
                   if self.above_unseen is not None else f"; {self.alpha:.0%} of runs should measure above it")
        fixed = ""
        if self.fixed_below_bytes or self.fixed_above_bytes:
            fixed = (f"; plus -{self.fixed_below_bytes / 2**30:.2f}/+{self.fixed_above_bytes / 2**30:.2f} GiB for "
                     f"fixed memory not measured on this GPU: {', '.join(self.unmeasured)}")
        return (f"range {self.low_bytes / 2**30:.2f}-{self.high_bytes / 2**30:.2f} GiB ({self.kind} step; "
                f"calibrated on {self.runs} GPU runs{pooled}{checked}{fixed})")


def peak_range(trace: Trace, point_bytes: int, context_bytes: int,
               calibration: Calibration | None = None, fixed: "FixedMemory | None" = None) -> PeakRange | None:
    """The calibrated range for a peak of ``point_bytes`` (context included), or None without a
    calibration. The scores were measured without the context (what NVML adds over it).

    ``fixed``: the step's fixed memory on the target GPU; what of it was not measured there
    widens the range by its parts' own ranges, beyond the step's calibrated spread (the
    calibration runs measured their GPUs' fixed memory: on them it adds nothing)."""
    cal = calibration if calibration is not None else load_calibration()
    if cal is None:
        return None
    kind = workload_kind(trace)
    found = cal.for_kind(kind)
    if found is None:
        return None
    (lo, hi), group = found
    body = point_bytes - context_bytes
    scale = scale_bytes(trace, kind, body)
    low = context_bytes + max(0, round(body + lo * scale))
    high = context_bytes + max(0, round(body + hi * scale))
    above = (cal.checked or {}).get("above_high")
    low, high = min(low, point_bytes), max(high, point_bytes)
    if fixed is None:
        return PeakRange(low, high, kind, group, cal.runs[group], cal.alpha, above)
    below_f = min(fixed.below_bytes, low)
    return PeakRange(low - below_f, high + fixed.above_bytes, kind, group, cal.runs[group], cal.alpha, above,
                     below_f, fixed.above_bytes, tuple(p.what for p in fixed.unmeasured))
