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
    python benchmarks/gpu_groundtruth.py --fixed-memory     # the process's fixed memory, stage by stage
    torchrun --nproc-per-node 8 benchmarks/gpu_groundtruth.py --fixed-memory   # NCCL across 8 ranks

`--fixed-memory` measures what a PyTorch training process holds outside its tensors, in a fresh
process, at each stage a training step passes: the bare CUDA context, the first matmul (PyTorch's
and cuBLAS/cuBLASLt's kernels, an optimizer step), the first convolution (cuDNN), a process group
(NCCL: one rank alone, or every rank under torchrun). Each stage's memory is the device memory it
added less what PyTorch's allocator reserved in it. It appends one record to
`<out>/fixed_memory-<gpu-slug>-<date>.jsonl` and prints the catalog entry (xmem_engine/data/gpus.toml
layout) that fills the GPU's fixed-memory figures, with their sources.
"""
from __future__ import annotations

import argparse
import contextlib
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


# ------------------------------------------------------------------ fixed memory, stage by stage

#: The stages of a training process, in order, and the catalog field each one's memory fills.
STAGES = ("context", "first_matmul", "first_convolution", "process_group")
STAGE_FIELDS = {"context": "context_bytes", "first_matmul": "kernel_bytes", "first_convolution": "cudnn_bytes",
                "process_group": "nccl_bytes"}


@dataclass
class StageReading:
    """Device memory right after one stage (``before_init``: before CUDA is initialised)."""

    stage: str
    nvml_used: int | None  # NVML v1 used (total - free), device-wide; None without NVML
    nvml_reserved: int | None  # NVML v2 "Reserved", where the driver and bindings give it
    cuda_used: int | None  # torch.cuda.mem_get_info: total - free (nvidia-smi's used); None before init
    cuda_total: int | None  # torch.cuda.mem_get_info's total (totalGlobalMem)
    allocator_reserved: int  # torch.cuda.memory_reserved(): what the stage's tensors took


def fixed_memory_table(readings: list[StageReading]) -> dict[str, int | None]:
    """Per catalog field, the memory each stage added outside PyTorch's allocator: the device's
    used memory after it less before it, less what the allocator reserved in between. NVML's
    reading (device-wide, so the GPU must be otherwise idle) where there is one: it is the only
    one before CUDA exists; mem_get_info's after. Also ``driver_reserved_bytes``: NVML v2's
    Reserved, else NVML's total less totalGlobalMem."""
    by = {r.stage: r for r in readings}
    if "before_init" not in by:
        raise ValueError("the readings start before CUDA init ('before_init')")
    out: dict[str, int | None] = {}
    prev = by["before_init"]
    for stage in STAGES:
        r = by.get(stage)
        if r is None:
            out[STAGE_FIELDS[stage]] = None
            continue
        if r.nvml_used is not None and prev.nvml_used is not None:
            added = r.nvml_used - prev.nvml_used
        elif r.cuda_used is not None and prev.cuda_used is not None:
            added = r.cuda_used - prev.cuda_used
        else:
            added = None
        out[STAGE_FIELDS[stage]] = (None if added is None
                                    else max(0, added - (r.allocator_reserved - prev.allocator_reserved)))
        prev = r
    last = readings[-1]
    out["driver_reserved_bytes"] = last.nvml_reserved
    return out


def _stage_child(result_path: Path, dry_run: bool) -> int:
    """The stages, run in this (fresh) process: writes the readings and versions as JSON."""
    import contextlib

    import torch

    from benchmarks._nvml import Nvml

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    nvml = None if dry_run else Nvml.open()
    if nvml is not None:  # this rank's GPU: the LOCAL_RANK-th visible one
        with contextlib.suppress(Exception):
            visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
            which = visible[local] if local < len(visible) else str(local)
            if which.startswith(("GPU-", "MIG-")):
                nvml.select(which)
            else:
                nvml._handle = nvml._nvml.nvmlDeviceGetHandleByIndex(int(which))
    dev = torch.device("cpu") if dry_run else torch.device("cuda", local)
    readings: list[StageReading] = []

    def nvml_reading() -> tuple[int | None, int | None, int | None]:
        if nvml is None:
            return None, None, None
        used = nvml.used()
        n, h = nvml._nvml, nvml._handle
        try:  # nvmlMemory_v2_t: bindings and drivers from about R510 on
            info = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
            return used, int(info.reserved), int(info.total)
        except Exception:
            return used, None, int(n.nvmlDeviceGetMemoryInfo(h).total)

    def read(stage: str) -> None:
        used, reserved, total = nvml_reading()
        cuda_used = cuda_total = None
        if dry_run:
            import resource

            cuda_used = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # a stand-in: host RSS
        elif stage == "before_init":
            if used is None:  # no NVML: nvidia-smi's used, which mem_get_info's total - free matches
                from benchmarks._nvml import nvidia_smi

                smi = nvidia_smi("memory.used")
                cuda_used = int(smi) << 20 if smi and smi.isdigit() else None
        else:
            torch.cuda.synchronize(dev)
            free, cuda_total = torch.cuda.mem_get_info(dev)
            cuda_used = cuda_total - free
            if reserved is None and total is not None:
                reserved = total - cuda_total  # NVML's total less totalGlobalMem: the driver's reserve
        readings.append(StageReading(stage, used, reserved, cuda_used, cuda_total,
                                     0 if dry_run else torch.cuda.memory_reserved(dev)))

    read("before_init")
    if not dry_run:
        torch.cuda.set_device(dev)
    torch.empty(1, device=dev)  # creates the context; launches no kernel
    read("context")
    lin = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).to(dev)
    opt = torch.optim.AdamW(lin.parameters())
    for dtype in (torch.float32, torch.bfloat16 if dry_run else torch.float16):
        with torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = lin(torch.randn(64, 256, device=dev)).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    read("first_matmul")
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
                               torch.nn.Conv2d(32, 32, 3, stride=2)).to(dev)
    for dtype in (torch.float32, torch.bfloat16 if dry_run else torch.float16):
        with torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32):
            out = conv(torch.randn(8, 3, 64, 64, device=dev)).float().mean()
        out.backward()
    read("first_convolution")
    import torch.distributed as dist

    if dist.is_available():
        backend = "gloo" if dry_run else "nccl"
        if world > 1:  # torchrun's env:// rendezvous
            kw: dict[str, Any] = {} if dry_run else {"device_id": dev}
            dist.init_process_group(backend, **kw)
        else:
            kw = {"store": dist.HashStore(), "rank": 0, "world_size": 1}
            if not dry_run:
                kw["device_id"] = dev  # eager: the communicator is made now
            dist.init_process_group(backend, **kw)
        x = torch.ones(1 << 20, device=dev)
        dist.all_reduce(x)
        dist.barrier()
        read("process_group")
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
                "nccl": None, "driver": None, "gpu_name": "cpu-dry-run" if dry_run else torch.cuda.get_device_name(dev),
                "cuda_module_loading": os.environ.get("CUDA_MODULE_LOADING", "LAZY (PyTorch's default)"),
                "rank": rank, "world_size": world}
    if not dry_run:
        with contextlib.suppress(Exception):
            versions["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        if nvml is not None:
            with contextlib.suppress(Exception):
                versions["driver"] = nvml.driver_version()
    result_path.write_text(json.dumps({"readings": [asdict(r) for r in readings], "versions": versions}))
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    return 0


def catalog_snippet(table: dict[str, int | None], versions: dict[str, Any], day: str) -> str:
    """The gpus.toml lines that fill a GPU's fixed memory from one measurement, with sources."""
    name = versions.get("gpu_name") or "UNKNOWN"
    key = name
    with contextlib.suppress(Exception):
        from xmem_engine.gpus import get_gpu

        key = get_gpu(name).key
    world = versions.get("world_size", 1)
    setup = (f"measured by benchmarks/gpu_groundtruth.py --fixed-memory on {name} ({day}; driver "
             f"{versions.get('driver')}, torch {versions.get('torch')}, CUDA {versions.get('cuda')}, cuDNN "
             f"{versions.get('cudnn')}, NCCL {versions.get('nccl')}, CUDA_MODULE_LOADING "
             f"{versions.get('cuda_module_loading')})")
    what = {"context_bytes": "device memory after CUDA init (an empty tensor, no kernel) less before",
            "kernel_bytes": "added by a Linear/GELU/AdamW step in fp32 and fp16 autocast beyond what the allocator reserved",
            "cudnn_bytes": "added by Conv2d/BatchNorm2d forward and backward in fp32 and fp16 beyond the allocator",
            "nccl_bytes": f"added by init_process_group('nccl') of {world} rank(s) and an all_reduce beyond the allocator",
            "driver_reserved_bytes": "NVML v2 Reserved (else NVML total less totalGlobalMem)"}
    values, sources = [], []
    for field in ("context_bytes", "kernel_bytes", "cudnn_bytes", "nccl_bytes", "driver_reserved_bytes"):
        value = table.get(field)
        if value is None:
            values.append(f"# {field}: not measured")
            continue
        comment = "  # one rank alone: a lower bound for a group of several" if field == "nccl_bytes" and world == 1 else ""
        prefix = "# " if comment else ""
        values.append(f"{prefix}{field} = {value:_}{comment}")
        sources.append(f'{prefix}{field} = {json.dumps(setup + ": " + what[field])}')
    return "\n".join([f'[gpus."{key}"]', *values, "", f'[gpus."{key}".sources]', *sources])


def fixed_memory_main(out_dir: Path, dry_run: bool, timeout_s: float) -> int:
    """Run the stages in a fresh process, append the record, print the catalog entry."""
    with tempfile.TemporaryDirectory(prefix="xmem-fixed-") as tmp:
        result = Path(tmp, "stages.json")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--stages-child", str(result)] + (
            ["--dry-run"] if dry_run else [])
        try:
            proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            print(f"the stages did not finish in {timeout_s:.0f} s", file=sys.stderr)
            return 1
        if proc.returncode != 0 or not result.exists():
            print(f"the stage process failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
            return 1
        data = json.loads(result.read_text())
    readings = [StageReading(**r) for r in data["readings"]]
    table = fixed_memory_table(readings)
    now = dt.datetime.now(dt.timezone.utc)
    versions = data["versions"]
    record = {"schema": SCHEMA_VERSION, "kind": "fixed_memory", "session": now.isoformat(timespec="seconds"),
              "dry_run": dry_run, "versions": versions, "readings": data["readings"], "fixed_memory": table}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"fixed_memory-{slugify(versions.get('gpu_name') or 'unknown')}-{now:%Y-%m-%d}.jsonl"
    with path.open("a") as fh:
        fh.write(json.dumps(record) + "\n")
    for field, value in table.items():
        print(f"{field:>22}: {_mib(value)} MiB")
    print(f"\n{catalog_snippet(table, versions, f'{now:%Y-%m-%d}')}\n\nwrote the record to {path}")
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="run on the CPU with tiny sizes (no CUDA needed)")
    p.add_argument("--out", type=Path, default=None, help=f"output directory (default {DEFAULT_OUT})")
    p.add_argument("--only", default="", help="comma-separated run names")
    p.add_argument("--list", action="store_true", help="list the runs and exit")
    p.add_argument("--timeout", type=float, default=Options.timeout_s, help="per-run timeout, seconds")
    p.add_argument("--budget", type=float, default=Options.budget_s, help="whole-batch time budget, seconds")
    p.add_argument("--fixed-memory", action="store_true",
                   help="measure the process's fixed memory stage by stage (context, first matmul, first "
                        "convolution, process group) and print the catalog entry it fills")
    p.add_argument("--stages-child", type=Path, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.stages_child is not None:
        return _stage_child(args.stages_child, args.dry_run)
    if args.fixed_memory:
        if not args.dry_run:
            from benchmarks._nvml import gpu_name_without_cuda
            if not gpu_name_without_cuda():
                print("no NVIDIA GPU visible (NVML / nvidia-smi); use --dry-run to exercise the stages on the CPU",
                      file=sys.stderr)
                return 2
        out = args.out or (Path(tempfile.mkdtemp(prefix="xmem-fixed-dry-")) if args.dry_run else DEFAULT_OUT)
        return fixed_memory_main(out, args.dry_run, args.timeout)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    try:
        runs = select(names, args.dry_run)
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
