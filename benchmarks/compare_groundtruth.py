"""xmem's CPU-side prediction against GPU ground truth recorded by gpu_groundtruth.py.

For each recorded run (``benchmarks/data/gpu_groundtruth-*.jsonl``) this estimates the same
workload script, with the same overrides and allocator settings, for the same GPU and
PyTorch version, on the CPU, and prints predicted vs measured peak allocated, peak reserved
and device peak with relative errors. It then compares the predicted allocation sequence
with the recorded one request by request and reports the first divergence (index, size,
op and module on xmem's side, source line on the GPU's side). Needs no GPU.

    python benchmarks/compare_groundtruth.py [--data FILE ...] [--only RUN[,RUN]]
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = REPO / "benchmarks" / "data"
sys.path.insert(0, str(REPO))

from benchmarks._snapshot_trim import load_snapshot  # noqa: E402


@dataclass
class Comparison:
    run: str
    gpu: str
    pred_allocated: int
    meas_allocated: int
    pred_reserved: int
    meas_reserved: int
    pred_device: int
    meas_device: int | None
    first_divergence: str
    error: str = ""


def _rel(pred: int, meas: int | None) -> str:
    if not meas:
        return "n/a"
    return f"{100 * (pred - meas) / meas:+.2f}%"


def first_divergence(predicted: list[tuple[int, str, str]], recorded: list[tuple[int, str]]) -> str:
    """The first request where the two allocation sequences differ in size."""
    for i, ((size, op, module), (rsize, where)) in enumerate(zip(predicted, recorded)):
        if size != rsize:
            return (f"request {i}: xmem {size} B ({op or '?'} in {module or '(no module)'}) vs GPU {rsize} B "
                    f"at {where or '(no Python frame)'}")
    if len(predicted) != len(recorded):
        n = min(len(predicted), len(recorded))
        return f"same first {n} requests; xmem made {len(predicted)}, the GPU {len(recorded)}"
    return "none: identical request sequence"


def estimate_recorded(rec: dict, gpu_name: str | None = None) -> Any:
    """xmem's estimate of a recorded run: its script with the same overrides and allocator settings,
    for the recorded GPU (or ``gpu_name``) and PyTorch version."""
    from xmem_engine.estimate import estimate_script, resolve_gpu
    from xmem_engine.overrides import as_set_text

    env = rec.get("env") or {}
    gpu = resolve_gpu(gpu_name or env.get("gpu_name") or "")
    overrides = {k: as_set_text(v) for k, v in (rec.get("overrides") or {}).items() if k != "device"}
    alloc_conf = (rec.get("env_vars") or {}).get("PYTORCH_CUDA_ALLOC_CONF") or env.get("alloc_conf") or ""
    script = Path(rec["script"])
    if not script.is_absolute():
        script = REPO / script
    return estimate_script(script, gpu, overrides=overrides, alloc_conf=alloc_conf,
                           torch_version=(env.get("torch_version") or "").split("+")[0] or None)


def recorded_allocs(rec: dict, base_dir: Path) -> list[dict]:
    """The recording's allocation requests, in order (device 0's ``device_traces``)."""
    snap = load_snapshot(rec, base_dir=base_dir)
    if snap is None:
        raise FileNotFoundError("the record has no snapshot")
    traces = snap.get("device_traces") or []
    events = traces[0] if traces and isinstance(traces[0], list) else traces
    return [e for e in events if e.get("action") == "alloc"]


def compare_record(rec: dict, base_dir: Path, gpu_name: str | None = None) -> Comparison:
    env = rec.get("env") or {}
    name = rec.get("run", "?")
    alloc = rec.get("allocator") or {}
    dev = rec.get("device_memory") or {}
    try:
        est = estimate_recorded(rec, gpu_name)
    except Exception as e:  # recorded per run; the comparison goes on
        message = " ".join(f"{type(e).__name__}: {e}".split())
        return Comparison(name, env.get("gpu_name", "?"), 0, 0, 0, 0, 0, None, "", message)
    predicted = [(e.bytes, e.op, e.module) for e in est.simulated_events or [] if e.kind == "alloc"]
    recorded: list[tuple[int, str]] = []
    try:
        recorded = [(e["size"], e.get("where") or "") for e in recorded_allocs(rec, base_dir)]
    except Exception as e:  # a run without a snapshot still compares its peaks
        recorded = []
        divergence = f"no recorded snapshot ({type(e).__name__})"
    else:
        divergence = first_divergence(predicted, recorded)
    meas_device = None
    if dev.get("peak_used") is not None and dev.get("used_before_init") is not None:
        meas_device = dev["peak_used"] - dev["used_before_init"]
    return Comparison(
        run=name, gpu=est.target.key,
        pred_allocated=est.peak_allocated_bytes, meas_allocated=int(alloc.get("max_memory_allocated") or 0),
        pred_reserved=est.peak_reserved_bytes, meas_reserved=int(alloc.get("max_memory_reserved") or 0),
        pred_device=est.peak_device_bytes, meas_device=meas_device, first_divergence=divergence,
    )


def table(rows: list[Comparison]) -> str:
    gib = 1 << 30
    out = ["| run | GPU | peak allocated (xmem / GPU) | error | peak reserved (xmem / GPU) | error | "
           "device peak (xmem / GPU) | error |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.error:
            out.append(f"| {r.run} | {r.gpu} | could not estimate: {r.error[:80]} | | | | | |")
            continue
        dev = f"{r.pred_device / gib:.3f} / {r.meas_device / gib:.3f}" if r.meas_device else f"{r.pred_device / gib:.3f} / n/a"
        out.append(f"| {r.run} | {r.gpu} | {r.pred_allocated / gib:.3f} / {r.meas_allocated / gib:.3f} | "
                   f"{_rel(r.pred_allocated, r.meas_allocated)} | {r.pred_reserved / gib:.3f} / "
                   f"{r.meas_reserved / gib:.3f} | {_rel(r.pred_reserved, r.meas_reserved)} | {dev} | "
                   f"{_rel(r.pred_device, r.meas_device)} |")
    out.append("")
    out.extend(f"- {r.run}: first divergence: {r.first_divergence}" for r in rows if not r.error)
    return "\n".join(out)


def load_records(paths: list[str]) -> list[tuple[dict, Path]]:
    records = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    records.append((json.loads(line), Path(p).parent))
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", nargs="*", help="JSON-lines files (default: benchmarks/data/gpu_groundtruth-*.jsonl)")
    ap.add_argument("--only", help="comma-separated run names")
    ap.add_argument("--gpu", help="estimate for this GPU instead of the recorded one (e.g. for --dry-run data)")
    args = ap.parse_args(argv)
    paths = args.data or sorted(glob.glob(str(DATA_DIR / "gpu_groundtruth-*.jsonl")))
    if not paths:
        print("no ground-truth data yet: run benchmarks/gpu_groundtruth.py on a machine with a GPU "
              "and commit benchmarks/data/", file=sys.stderr)
        return 2
    records = [(r, base) for r, base in load_records(paths) if not r.get("error")]
    if args.only:
        wanted = set(args.only.split(","))
        records = [(r, base) for r, base in records if r.get("run") in wanted]
    rows = [compare_record(r, base, args.gpu) for r, base in records]
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
