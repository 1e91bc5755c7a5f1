"""Record GPU memory ground truth for the workloads in benchmarks/workloads/.

Each run executes in a fresh Python process (benchmarks/_gpu_recorder.py) so it
pays its own CUDA init and picks up its own PYTORCH_CUDA_ALLOC_CONF.  One JSON
object per run is appended to
`<out>/gpu_groundtruth-<gpu-slug>-<date>.jsonl`; large trimmed snapshots go
to `<out>/snapshots/`.  This process never touches CUDA itself, so it adds
nothing to the device memory the runs see.

    python benchmarks/gpu_groundtruth.py                 # all runs, needs a GPU
    python benchmarks/gpu_groundtruth.py --list
    python benchmarks/gpu_groundtruth.py --only gpt2-small-bs8x1024-bf16
    python benchmarks/gpu_groundtruth.py --dry-run --out /tmp/gt   # CPU, tiny sizes
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._gpu_recorder import RecorderSpec  # noqa: E402
from benchmarks.workloads import RunSpec, select  # noqa: E402

SCHEMA_VERSION = 1
BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RECORDER = BENCH_DIR / "_gpu_recorder.py"
DEFAULT_OUT = BENCH_DIR / "data"
MiB = 2**20


@dataclass
class Options:
    """How to run the batch; the defaults keep a full H200 batch well under 8 minutes."""

    out_dir: Path = DEFAULT_OUT
    dry_run: bool = False
    timeout_s: float = 120.0
    budget_s: float = 450.0
    max_entries: int = 1_000_000
    inline_limit: int = 64 * 1024
    file_limit: int = 2 * 1024 * 1024


def slugify(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def output_paths(out_dir: Path, gpu_name: str, now: dt.datetime) -> tuple[Path, str]:
    """JSON-lines file for this GPU and day, and the stem for this session's snapshot files."""
    slug = slugify(gpu_name)
    return out_dir / f"gpu_groundtruth-{slug}-{now:%Y-%m-%d}.jsonl", f"{slug}-{now:%Y%m%dT%H%M%SZ}"


def _error(stage: str, type_: str, message: str, tail: str = "") -> dict[str, Any]:
    return {"stage": stage, "type": type_, "message": message, "traceback": tail[-4000:]}


def run_one(run: RunSpec, opts: Options, snapshot_stem: str, timeout_s: float) -> dict[str, Any]:
    """Run one RunSpec in a fresh recorder process and return its record (errors included)."""
    where_files = [str(p) for p in [run.script.parent / "models.py"] if p.exists()]
    spec = RecorderSpec(run=run.name, script=str(run.script.resolve()),
                        overrides=run.effective_overrides(opts.dry_run),
                        snapshot_path=str(opts.out_dir / "snapshots" / f"{snapshot_stem}-{run.name}.json.gz"),
                        dry_run=opts.dry_run, max_entries=opts.max_entries, inline_limit=opts.inline_limit,
                        file_limit=opts.file_limit, where_files=where_files)
    env = {**os.environ, **run.env, "PYTHONUNBUFFERED": "1"}
    base = {"run": run.name, "script": spec.script, "overrides": spec.overrides, "dry_run": opts.dry_run}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="xmem-gt-") as tmp:
        spec_file, result_file = Path(tmp, "spec.json"), Path(tmp, "result.json")
        spec_file.write_text(json.dumps(asdict(spec)))
        try:
            proc = subprocess.run([sys.executable, str(RECORDER), str(spec_file), str(result_file)],
                                  cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            out = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            rec = {**base, "error": _error("timeout", "Timeout", f"run exceeded {timeout_s:.0f} s", out)}
            proc = None
        else:
            if result_file.exists():
                rec = json.loads(result_file.read_text())
            else:
                rec = {**base, "error": _error("process", "RecorderCrashed",
                                               f"recorder exited with code {proc.returncode}", proc.stderr)}
    rec["process_s"] = round(time.perf_counter() - t0, 3)
    rec["returncode"] = None if proc is None else proc.returncode
    rec["stdout_tail"] = "" if proc is None else proc.stdout[-1000:]
    if rec.get("error") and proc is not None:
        rec["stderr_tail"] = proc.stderr[-2000:]
    rec["env_vars"] = dict(run.env)
    if rec.get("snapshot_file"):
        rec["snapshot_file"] = os.path.relpath(rec["snapshot_file"], opts.out_dir)
    return rec


def run_all(runs: list[RunSpec], opts: Options, gpu_name: str) -> tuple[Path, list[dict[str, Any]]]:
    """Run every RunSpec in order, appending each record to the JSON-lines file as it finishes."""
    now = dt.datetime.now(dt.timezone.utc)
    jsonl, stem = output_paths(opts.out_dir, gpu_name, now)
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    session = now.isoformat(timespec="seconds")
    start, records = time.perf_counter(), []
    for i, run in enumerate(runs, 1):
        left = opts.budget_s - (time.perf_counter() - start)
        if left < 15:
            rec = {"run": run.name, "script": str(run.script), "overrides": run.effective_overrides(opts.dry_run),
                   "dry_run": opts.dry_run, "env_vars": dict(run.env),
                   "error": _error("skipped", "TimeBudget", f"batch time budget of {opts.budget_s:.0f} s used up")}
        else:
            rec = run_one(run, opts, stem, min(opts.timeout_s, left))
        rec = {"schema": SCHEMA_VERSION, "session": session, **rec}
        records.append(rec)
        with jsonl.open("a") as fh:
            fh.write(json.dumps(rec, default=str) + "\n")
        status = "ok" if not rec.get("error") else f"{rec['error']['stage']}: {rec['error']['type']}"
        print(f"[{i}/{len(runs)}] {run.name}: {status} ({rec.get('process_s', 0):.1f} s)", file=sys.stderr, flush=True)
    return jsonl, records


def _mib(value: Any) -> str:
    return f"{value / MiB:,.0f}" if isinstance(value, (int, float)) else "-"


def format_table(records: list[dict[str, Any]]) -> str:
    """Human summary: allocator peaks, device-level peak above the pre-init baseline, context cost."""
    head = ("run", "status", "max alloc", "max resv", "peak used", "peak-base", "ctx", "events", "secs")
    rows = [head]
    for r in records:
        mem, alloc = r.get("device_memory") or {}, r.get("allocator") or {}
        base, after, peak = mem.get("used_before_init"), mem.get("used_after_init_sampler"), mem.get("peak_used")
        same_source = mem.get("used_before_init_source") == mem.get("sampler_source")
        rows.append((
            r["run"],
            "ok" if not r.get("error") else r["error"]["type"],
            _mib(alloc.get("max_memory_allocated")),
            _mib(alloc.get("max_memory_reserved")),
            _mib(peak),
            _mib(peak - base) if same_source and None not in (peak, base) else "-",
            _mib(after - base) if same_source and None not in (after, base) else "-",
            str(r.get("snapshot_events", "-")),
            f"{r.get('process_s', 0):.1f}",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n(memory in MiB; peak-base and ctx are relative to device use before CUDA init)"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="run on the CPU with tiny sizes (no CUDA needed)")
    p.add_argument("--out", type=Path, default=None, help=f"output directory (default {DEFAULT_OUT})")
    p.add_argument("--only", default="", help="comma-separated run names")
    p.add_argument("--list", action="store_true", help="list the runs and exit")
    p.add_argument("--timeout", type=float, default=Options.timeout_s, help="per-run timeout, seconds")
    p.add_argument("--budget", type=float, default=Options.budget_s, help="whole-batch time budget, seconds")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    try:
        runs = select(names)
    except KeyError as exc:
        print(exc.args[0], file=sys.stderr)
        return 2
    if args.list:
        for r in runs:
            env = " ".join(f"{k}={v}" for k, v in r.env.items())
            sets = " ".join(f"{k}={v!r}" for k, v in r.overrides.items())
            print(f"{r.name:40s} {r.script.relative_to(REPO_ROOT)}  {sets}  {env}".rstrip())
        return 0
    if args.dry_run:
        gpu_name = "cpu-dry-run"
        out = args.out or Path(tempfile.mkdtemp(prefix="xmem-gt-dry-"))
    else:
        from benchmarks._nvml import gpu_name_without_cuda
        gpu_name = gpu_name_without_cuda() or ""
        if not gpu_name:
            print("no NVIDIA GPU visible (NVML / nvidia-smi); use --dry-run to exercise the pipeline on the CPU",
                  file=sys.stderr)
            return 2
        out = args.out or DEFAULT_OUT
    opts = Options(out_dir=out, dry_run=args.dry_run, timeout_s=args.timeout, budget_s=args.budget)
    jsonl, records = run_all(runs, opts, gpu_name)
    print(format_table(records))
    print(f"wrote {len(records)} record(s) to {jsonl}")
    return 0 if all(not r.get("error") for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
