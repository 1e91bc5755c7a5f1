"""Measure cuDNN's convolution workspaces on a GPU, for xmem_engine/gpus/cudnn.py.

Which engine cuDNN's heuristics pick, and so how much workspace a convolution asks the caching
allocator for, is decided on the GPU. This script measures it, problem by problem, in three steps:

    .venv/bin/python benchmarks/cudnn_workspaces.py collect     # CPU: the problems of the workloads
    python benchmarks/cudnn_workspaces.py measure               # GPU: each problem's workspace
    .venv/bin/python benchmarks/cudnn_workspaces.py install FILE  # CPU: into the engine's tables

``collect`` traces the convolutional ground-truth runs of ``benchmarks/workloads/`` (the runs
``gpu_groundtruth.py`` records, so that each measured table can be checked against a measured
step on the same GPU) and, with ``--zoo`` (``.venv-bench``: torchvision, timm, diffusers), the
zoo's scripts, and writes their
problems to ``benchmarks/data/conv_problems.json``. ``measure`` runs each problem's op
(``aten.convolution`` or ``convolution_backward`` with one output asked for) twice under
PyTorch's defaults (heuristics mode, ``cudnn.benchmark`` off) and takes what the second call's
peak allocated beyond its inputs and outputs: the workspace (and any copy cuDNN's path makes),
as the caching allocator saw it. It writes ``benchmarks/data/cudnn_workspaces-<gpu>-<date>.json``
in the engine's table format; ``install`` merges such a file into
``xmem_engine/data/cudnn_workspaces.json`` (replacing the table of the same architecture).
``measure --dry-run`` runs everything on the CPU with workspaces of 0, to check the script.

Without a GPU at hand, ``from-recordings`` reads the same figures off ground-truth recordings
(``benchmarks/data/gpu_groundtruth-*.jsonl``, whose allocator snapshots hold every request):

    .venv/bin/python benchmarks/cudnn_workspaces.py from-recordings resnet50-bs64-sgd ...

It estimates each run on the CPU with no workspaces, lines xmem's requests up with the GPU's
(difflib on sizes: every request xmem makes must be found in order), and takes the GPU's
requests that xmem lacks inside a convolution call as its workspaces: after a forward's
output; in backward, those before the weight gradient is allocated for the data gradient, the
rest for the weight's. A problem seen several times keeps its largest; calls whose window holds
a request xmem made but the GPU did not (unaligned) are skipped and counted. The file it writes
has ``measure``'s format, its source naming the recordings.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import re
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` and the engine importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from xmem_engine.gpus.cudnn import WORKSPACES_FILE, ConvProblem  # noqa: E402

BENCH = Path(__file__).resolve().parent
PROBLEMS_FILE = BENCH / "data" / "conv_problems.json"
CONV_WORKLOADS = ("resnet50", "mobilenetv2")  # the ground-truth workloads that run convolutions


def _runs() -> list:
    from benchmarks.workloads import WORKLOADS

    return [r for r in WORKLOADS if r.script.stem in CONV_WORKLOADS and not r.env]


def collect(zoo: bool, out: Path) -> dict:
    """Trace the workloads on the CPU and gather their convolution problems."""
    from xmem_engine.overrides import as_set_text
    from xmem_engine.tracing.script import trace_script

    sources: dict[str, list[str]] = {}
    targets = [(r.name, r.script, {k: as_set_text(v) for k, v in r.overrides.items()}) for r in _runs()]
    if zoo:
        targets += [(f"zoo/{p.stem}", p, {}) for p in sorted((BENCH / "zoo").glob("*.py"))]
    for name, script, overrides in targets:
        t0 = time.perf_counter()
        try:
            tr = trace_script(script, mode="fake", overrides=overrides, max_iterations=1)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - a zoo script whose libraries are missing, or that fails
            print(f"{name}: skipped ({type(e).__name__}: {str(e)[:120]})", flush=True)
            continue
        keys = [k for _, ks in tr.meta.get("conv_calls", []) for k in ks]
        for k in dict.fromkeys(keys):
            sources.setdefault(k, []).append(name)
        print(f"{name}: {len(keys)} convolution calls, {len(set(keys))} problems ({time.perf_counter() - t0:.1f} s)",
              flush=True)
    doc = {"what": "convolution problems of the traced workloads (xmem_engine/gpus/cudnn.py ConvProblem keys)",
           "problems": sources}  # in the order met: the ground-truth workloads' first, measured first
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(sources)} problems -> {out}")
    return doc


def _tensors(x) -> list:
    import torch

    if isinstance(x, torch.Tensor):
        return [x]
    return [t for t in (x if isinstance(x, (list, tuple)) else []) if isinstance(t, torch.Tensor)]


def measure_one(p: ConvProblem, device: str) -> int:
    """Bytes the problem's op took, at its peak, beyond its inputs and outputs (0 on the CPU)."""
    import torch

    dtype = getattr(torch, p.dtype)
    fmt = torch.contiguous_format
    if p.channels_last:
        fmt = torch.channels_last if len(p.input) == 4 else torch.channels_last_3d
    x = torch.randn(p.input, device=device, dtype=dtype).contiguous(memory_format=fmt)
    w = torch.randn(p.weight, device=device, dtype=dtype).contiguous(memory_format=fmt)
    conv = (list(p.stride), list(p.padding), list(p.dilation), p.transposed, list(p.output_padding), p.groups)
    if p.direction == "forward":
        def run():
            return torch.ops.aten.convolution(x, w, None, *conv)
    else:
        go = torch.ops.aten.convolution(x, w, None, *conv)
        go.normal_()
        mask = [p.direction == "backward_data", p.direction == "backward_weight", False]

        def run():
            return torch.ops.aten.convolution_backward(go, x, w, None, *conv, mask)
    cudnn = torch.backends.cudnn
    before = cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32
    cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32 = False, p.deterministic, p.allow_tf32
    try:
        run()  # first call: cuDNN's heuristics and its plan cache (allocates the same workspace)
        if device == "cpu":
            run()
            return 0
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = run()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        outputs = sum(-(-t.untyped_storage().nbytes() // 512) * 512 for t in _tensors(out))
        return max(0, peak - base - outputs)
    finally:
        cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32 = before


def measure(problems: Path, out_dir: Path, budget_s: float, dry_run: bool) -> Path:
    import torch

    doc = json.loads(problems.read_text())
    keys = list(doc["problems"])
    device = "cpu" if dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("measure needs a CUDA GPU (or --dry-run)")
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        gpu, cc = props.name, [props.major, props.minor]
    else:
        gpu, cc = "cpu (dry run)", [0, 0]
    sizes: dict[str, int] = {}
    errors: dict[str, str] = {}
    t0 = time.perf_counter()
    for i, k in enumerate(keys):
        if time.perf_counter() - t0 > budget_s:
            print(f"budget of {budget_s:.0f} s spent: {len(keys) - i} problems left unmeasured", flush=True)
            break
        try:
            problem = ConvProblem.from_key(k)
            if dry_run:  # the pipeline, not the figures: batch 1 keeps the CPU's convolutions quick
                problem = dataclasses.replace(problem, input=(1, *problem.input[1:]))
            sizes[k] = measure_one(problem, device)
        except Exception as e:  # noqa: BLE001 - one problem's failure (an OOM, an unsupported dtype) is data
            errors[k] = f"{type(e).__name__}: {str(e)[:200]}"
            if device == "cuda":
                torch.cuda.empty_cache()
        if (i + 1) % 50 == 0:
            print(f"{i + 1}/{len(keys)} problems, {time.perf_counter() - t0:.0f} s", flush=True)
    now = dt.datetime.now(dt.timezone.utc)
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    table = {"compute_capability": cc, "gpu": gpu, "cudnn_version": torch.backends.cudnn.version(),
             "torch_version": torch.__version__.split("+")[0],
             "source": f"benchmarks/cudnn_workspaces.py measure on {gpu}, {now:%Y-%m-%d}: "
                       f"{len(sizes)} problems of {problems.name}",
             "bytes": sizes}
    out = out_dir / f"cudnn_workspaces-{slug}-{now:%Y-%m-%d}.json"
    out_dir.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"tables": [table], "errors": errors, "dry_run": dry_run}, indent=1) + "\n")
    nonzero = sorted(((v, k) for k, v in sizes.items() if v), reverse=True)
    print(f"{len(sizes)} measured ({len(nonzero)} with a workspace), {len(errors)} failed, "
          f"{time.perf_counter() - t0:.1f} s -> {out}")
    for v, k in nonzero[:10]:
        print(f"  {v / 2**20:10.1f} MiB  {k}")
    return out


def workspaces_in_recording(rec: dict, base: Path) -> tuple[dict[str, list[int]], int, int]:
    """Per problem key, the workspace sizes one recorded run shows; also the calls read and skipped."""
    import difflib
    import os

    from benchmarks.compare_groundtruth import estimate_recorded, recorded_allocs
    from xmem_engine.tracing.patches import patched_item

    gpu_sizes = [e["size"] for e in recorded_allocs(rec, base)]
    with patched_item(os.environ, "XMEM_CUDNN_WORKSPACES", "off"):  # xmem's own requests only
        est = estimate_recorded(rec)
    xm = [e for e in est.simulated_events if e.kind == "alloc"]
    sm = difflib.SequenceMatcher(None, [e.bytes for e in xm], gpu_sizes, autojunk=False)
    at: dict[int, int] = {}  # xmem alloc index -> GPU alloc index
    for a, b, n in sm.get_matching_blocks():
        at.update((a + k, b + k) for k in range(n))
    index = {e.id: i for i, e in enumerate(xm)}
    matched_gpu = set(at.values())
    found: dict[str, list[int]] = {}
    read = skipped = 0
    for out_id, keys in (est.trace.meta.get("conv_calls") or []) if est.trace else []:
        i = index.get(out_id)
        if i is None:
            continue
        first = i  # the op's outputs: a backward's data gradient comes before its weight gradient
        while first > 0 and xm[first - 1].op == xm[i].op and xm[first - 1].module == xm[i].module:
            first -= 1
        nxt = i + 1
        if any(j not in at for j in range(first, nxt + 1)) or nxt >= len(xm):
            skipped += 1
            continue
        extra = [b for b in range(at[first] + 1, at[nxt]) if b not in matched_gpu]
        split = at[i]  # backward: extras before the weight gradient's request are the data gradient's
        by_dir = {"backward_data": [gpu_sizes[b] for b in extra if b < split],
                  "backward_weight": [gpu_sizes[b] for b in extra if b > split],
                  "forward": [gpu_sizes[b] for b in extra]}
        if len(keys) == 1 and keys[0].startswith("backward_weight"):
            by_dir["backward_weight"] = [gpu_sizes[b] for b in extra]
        for k in keys:
            found.setdefault(k, []).append(max(by_dir[k.split("|", 1)[0]], default=0))
        read += 1
    return found, read, skipped


def from_recordings(runs: list[str], data: list[Path], out_dir: Path) -> Path:
    """A workspace table read off ground-truth recordings (``measure``'s format)."""
    from benchmarks.compare_groundtruth import load_records

    records = [(r, b) for r, b in load_records([str(p) for p in data]) if not r.get("error")]
    by_run = {r["run"]: (r, b) for r, b in records}  # the last ok record of each run
    missing = [r for r in runs if r not in by_run]
    if missing:
        raise SystemExit(f"no recording of {', '.join(missing)} in {', '.join(map(str, data))}")
    sizes: dict[str, list[int]] = {}
    env = {}
    for name in runs:
        rec, base = by_run[name]
        env = rec.get("env") or env
        found, read, skipped = workspaces_in_recording(rec, base)
        for k, v in found.items():
            sizes.setdefault(k, []).extend(v)
        print(f"{name}: {read} convolution calls read, {skipped} skipped (unaligned), {len(found)} problems",
              flush=True)
    uneven = {k: sorted(set(v)) for k, v in sizes.items() if len(set(v)) > 1}
    for k, v in list(uneven.items())[:10]:
        print(f"  differs between calls, largest kept: {v} {k}")
    gpu = env.get("gpu_name", "?")
    cc = [int(x) for x in str(env.get("compute_capability", "0.0")).split(".")]
    day = rec.get("session", "")[:10]
    table = {"compute_capability": cc, "gpu": gpu, "cudnn_version": env.get("cudnn_version"),
             "torch_version": str(env.get("torch_version", "")).split("+")[0],
             "source": f"benchmarks/cudnn_workspaces.py from-recordings: read off the allocator snapshots of "
                       f"{', '.join(runs)} recorded on {gpu} {day} (benchmarks/data/gpu_groundtruth-*.jsonl)",
             "bytes": {k: max(v) for k, v in sizes.items()}}
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    out = out_dir / f"cudnn_workspaces-{slug}-{day or 'recorded'}.json"
    out_dir.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"tables": [table], "errors": {}, "dry_run": False}, indent=1) + "\n")
    nonzero = sum(1 for v in table["bytes"].values() if v)
    print(f"{len(table['bytes'])} problems ({nonzero} with a workspace, {len(uneven)} uneven) -> {out}")
    return out


def install(measured: Path, into: Path = WORKSPACES_FILE) -> None:
    """Merge a measured file's tables into the engine's (same architecture: replaced)."""
    new = json.loads(measured.read_text())
    if new.get("dry_run"):
        raise SystemExit(f"{measured} is a dry run's: not installed")
    old = json.loads(into.read_text()) if into.is_file() else {"tables": []}
    ccs = {tuple(t["compute_capability"]) for t in new["tables"]}
    tables = [t for t in old.get("tables", []) if tuple(t["compute_capability"]) not in ccs] + new["tables"]
    doc = {"what": "cuDNN convolution workspaces measured per GPU architecture (xmem_engine/gpus/cudnn.py)",
           "tables": sorted(tables, key=lambda t: t["compute_capability"])}
    into.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{into}: {len(doc['tables'])} table(s)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="trace the workloads on the CPU; write their convolution problems")
    c.add_argument("--zoo", action="store_true", help="also the zoo's scripts (those whose libraries import)")
    c.add_argument("--out", type=Path, default=PROBLEMS_FILE)
    m = sub.add_parser("measure", help="measure each problem's workspace on the GPU")
    m.add_argument("--problems", type=Path, default=PROBLEMS_FILE)
    m.add_argument("--out", type=Path, default=BENCH / "data")
    m.add_argument("--budget-s", type=float, default=240.0, help="stop measuring after this long")
    m.add_argument("--dry-run", action="store_true", help="on the CPU, workspaces 0: checks the script")
    r = sub.add_parser("from-recordings", help="read the workspaces off ground-truth recordings (no GPU needed)")
    r.add_argument("runs", nargs="+", help="run names in the recordings")
    r.add_argument("--data", type=Path, nargs="*", default=None,
                   help="JSON-lines files (default: benchmarks/data/gpu_groundtruth-*.jsonl)")
    r.add_argument("--out", type=Path, default=BENCH / "data")
    i = sub.add_parser("install", help="merge a measured file into xmem_engine/data/cudnn_workspaces.json")
    i.add_argument("file", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "collect":
        collect(a.zoo, a.out)
    elif a.cmd == "measure":
        measure(a.problems, a.out, a.budget_s, a.dry_run)
    elif a.cmd == "from-recordings":
        from_recordings(a.runs, a.data or sorted((BENCH / "data").glob("gpu_groundtruth-*.jsonl")), a.out)
    else:
        install(a.file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
