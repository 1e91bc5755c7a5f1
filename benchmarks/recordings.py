"""The tracer end to end against real GPU recordings: rebuild the workload behind a recording,
trace it on the CPU, and compare with what the GPU allocated, request by request.

The recordings (``../shared/allocator-traces``) are ``torch.cuda.memory._dump_snapshot``
files of public training code. For each one whose code was found, ``recordings/`` holds a
script that runs the same workload as its author's code (same ops, order and shapes; the
evidence is in ``benchmarks/README.md``). The recorded region starts at the script's
``torch.cuda.reset_peak_memory_stats()`` (followed by ``_record_memory_history``); the
traced events after the same call are its counterpart. Printed per recording:

- allocations of 1 KiB or more matched in order (the longest common subsequence of request
  sizes), out of the real ones; Triton's autotuning inside a recording (its benchmark's
  L2-flush buffers and copies of mutated arguments, at a compiled kernel's first launch, as
  many as the GPU's timings make) is counted apart and left out of the match;
- the first divergence: the real request with its frames, and the traced one with its op;
- the region's peak allocated and reserved, simulated from the trace for the recording's
  GPU class, beside the recording's own (replayed by the allocator simulator, which
  replays these recordings exactly).

    .venv-bench/bin/python benchmarks/recordings.py [--only NAME ...] [--json FILE] [--show-diff N]
"""

from __future__ import annotations

import argparse
import bisect
import difflib
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHARED = ROOT.parent / "shared" / "allocator-traces"
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks import _fake_cuda_guard  # noqa: E402

MIN_BYTES = 1024


@dataclass
class Rebuilt:
    """A recording and the script that rebuilds its workload."""

    recording: str
    script: str
    overrides: dict[str, str] = field(default_factory=dict)
    gpu: str = "A100-40GB"  # of the recording's GPU class (its cuBLAS workspace says which)
    torch: str | None = None  # the PyTorch version the author ran, when known
    compiled: bool = False  # torch.compile'd inside the recording: Inductor's schedule is its torch's


WED = "recordings/wed_memory_profile.py"
REBUILT = [
    Rebuilt("wed_medium_128_training.pickle", WED, {"context_length": "128"}, torch="2.11"),
    Rebuilt("wed_medium_256_training.pickle", WED, {"context_length": "256"}, torch="2.11"),
    Rebuilt("wed_medium_512_training.pickle", WED, {"context_length": "512", "autocast": "True"}, torch="2.11"),
    Rebuilt("wed_medium_1024_training.pickle", WED, {"context_length": "1024", "autocast": "True"}, torch="2.11"),
    Rebuilt("wed_medium_128_inference.pickle", WED, {"context_length": "128", "pattern": "'forward-only'"},
            torch="2.11"),
    Rebuilt("wed_medium_512_inference.pickle", WED,
            {"context_length": "512", "pattern": "'forward-only'", "autocast": "True"}, torch="2.11"),
    Rebuilt("wed_medium_1024_inference.pickle", WED, {"context_length": "1024", "pattern": "'forward-only'"},
            torch="2.11"),
]

KK = "recordings/kk/kk_benchmark.py"  # H100 SXM, torch 2.6.0 (recordings/kk/README.md)


def _kk(recording: str, compiled: bool = False, **overrides: str) -> Rebuilt:
    return Rebuilt(recording, KK, overrides, gpu="H100-SXM-80GB", torch="2.6", compiled=compiled)


REBUILT += [
    _kk("kk_memory_files_memory_ctx128_forward.pickle", pattern="'forward'", context_length="128", loop="False",
        empty_cache="False"),
    _kk("kk_memory_files_memory_ctx128_forward_mixed.pickle", pattern="'forward'", context_length="128",
        mixed_precision="True"),
    _kk("kk_memory_files_memory_ctx128_fullstep.pickle", pattern="'fullstep'", context_length="128", loop="False",
        empty_cache="False"),
    _kk("kk_memory_files_memory_ctx128_fullstep_.pickle", pattern="'fullstep'", context_length="128"),
    _kk("kk_memory_files_memory_ctx256_forward_.pickle", pattern="'forward'", context_length="256"),
    _kk("kk_memory_files_memory_ctx256_forward_mixed.pickle", pattern="'forward'", context_length="256",
        mixed_precision="True"),
    _kk("kk_memory_files_memory_ctx256_fullstep_.pickle", pattern="'fullstep'", context_length="256"),
    _kk("kk_memory_files_memory_ctx512_forward_.pickle", pattern="'forward'", context_length="512"),
    _kk("kk_memory_files_memory_ctx512_forward_mixed.pickle", pattern="'forward'", context_length="512",
        mixed_precision="True"),
    _kk("kk_memory_files_memory_ctx512_fullstep_.pickle", pattern="'fullstep'", context_length="512"),
    # torch.compile'd inside the recording (Dynamo, Inductor, autotuning): compiled for the H100 by
    # the installed torch's Inductor, whose schedule is the recording's only under torch 2.6
    # (`make recordings-compiled`)
    _kk("kk_cs336_systems_memory_logs_memory_ctx128_forward.pickle", compiled=True, harness="'memory_logs'",
        pattern="'forward'", context_length="128"),
]


@dataclass
class Comparison:
    recording: str
    real_allocs: int  # >= 1 KiB, autotuning's left out
    traced_allocs: int
    matched: int
    matched_fraction: float
    first_divergence: str
    real_peak_allocated: int
    traced_peak_allocated: int
    real_peak_reserved: int
    traced_peak_reserved: int
    seconds: float
    diffs: list[str] = field(default_factory=list)
    autotuning_allocs: int = 0  # real allocations >= 1 KiB made by Triton's autotuning (set aside)

    @property
    def peak_error(self) -> float:
        return (self.traced_peak_allocated - self.real_peak_allocated) / self.real_peak_allocated


def _frames(e: dict, top: int = 3) -> str:
    """The recorded event's innermost frames outside torch (the workload's own lines)."""
    out = []
    for f in e.get("frames") or []:
        name = f.get("filename", "")
        if "/torch/" in name or name.startswith("??") or not name:
            continue
        out.append(f"{Path(name).name}:{f.get('line')} {f.get('name', '')}")
        if len(out) == top:
            break
    return " < ".join(out) or "(no Python frames)"


#: frames of Triton's autotuning at a compiled kernel's first launch (torch/_inductor/runtime/
#: triton_heuristics.py, benchmarking.py; triton/testing.py): what it allocates depends on timings
AUTOTUNING_FRAMES = ("benchmark_all_configs", "do_bench", "clone_preserve_strides", "clone_args")


def autotuning(e: dict) -> bool:
    """A recorded allocation made by Triton's autotuning."""
    return any(f.get("name") in AUTOTUNING_FRAMES for f in e.get("frames") or [])


def lcs_length(a: list[int], b: list[int]) -> int:
    """The length of the longest common subsequence of ``a`` and ``b`` (bit-parallel, Hyyrö
    2004: one big-int step per element of ``a``). ``difflib`` finds matching blocks, not the
    longest subsequence: on the compiled kk recording it paired the traced layer 0 with the
    recorded layer 1 and gave up the whole prefix."""
    masks: dict[int, int] = {}
    for j, x in enumerate(b):
        masks[x] = masks.get(x, 0) | (1 << j)
    s = 0
    full = (1 << len(b)) - 1
    for x in a:
        m = masks.get(x, 0)
        if not m:
            continue
        t = m | s
        s = t & ~((t - ((s << 1) | 1)) & full) & full
    return bin(s).count("1")


def _region_start(events: list) -> int:
    """Index of the first traced event after the last ``reset_peak_memory_stats()``."""
    start = 0
    for i, e in enumerate(events):
        if e.kind == "reset_peak":
            start = i + 1
    return start


def _region(events: list) -> list:
    """The traced events after the last ``reset_peak_memory_stats()``."""
    return events[_region_start(events):]


def _region_peaks(est) -> tuple[int, int]:
    """Peak allocated and reserved bytes over the recorded region, as
    ``torch.cuda.max_memory_allocated()`` read at its end would say: the estimate's own peak
    covers the whole script (earlier runs of a loop included)."""
    from xmem_engine.resimulation import replay_inputs
    from xmem_engine.simulation.simulate import simulate

    events, config = replay_inputs(est, None)
    sim = simulate(events, config)
    start = _region_start(events)
    k = bisect.bisect_left(sim.timeline_event, start)
    before_al = sim.timeline_allocated[k - 1] if k else 0
    before_re = sim.timeline_reserved[k - 1] if k else 0
    return (max([before_al, *sim.timeline_allocated[k:]]), max([before_re, *sim.timeline_reserved[k:]]))


def compare(rb: Rebuilt, show_diff: int = 0) -> Comparison:
    from xmem_engine.estimate import estimate_trace
    from xmem_engine.gpus import get_gpu
    from xmem_engine.simulation.replay import replay_snapshot
    from xmem_engine.simulation.snapshot import load_snapshot
    from xmem_engine.tracing.script import trace_script

    snap = load_snapshot(SHARED / rb.recording)
    real_events = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
    replayed = replay_snapshot(snap)

    # Each workload vendors its author's own cs336_basics: forget the previous one's.
    for name in [m for m in sys.modules if m == "cs336_basics" or m.startswith("cs336_basics.")]:
        del sys.modules[name]
    t0 = time.perf_counter()
    # The GPU's properties size what its kernels allocate (reduction buffers by SM count).
    tr = trace_script(str(HERE / rb.script), overrides=rb.overrides, torch_version=rb.torch,
                      device=get_gpu(rb.gpu).properties())
    seconds = time.perf_counter() - t0
    est = estimate_trace(tr, rb.gpu, torch_version=rb.torch)
    traced = [e for e in _region(est.simulated_events) if e.kind == "alloc"]
    peak_allocated, peak_reserved = _region_peaks(est)

    real_big = [e for e in real_events if e["size"] >= MIN_BYTES and not autotuning(e)]
    tuning = sum(1 for e in real_events if e["size"] >= MIN_BYTES and autotuning(e))
    ours_big = [e for e in traced if e.bytes >= MIN_BYTES]
    a, b = [e["size"] for e in real_big], [e.bytes for e in ours_big]
    matched = lcs_length(a, b)
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)  # for showing where they differ
    first, diffs = "", []
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            continue
        real_part = "; ".join(f"{a[i]:,} B at {_frames(real_big[i])}" for i in range(i1, min(i2, i1 + 3)))
        ours_part = "; ".join(f"{b[j]:,} B {ours_big[j].op} at {ours_big[j].source}" for j in range(j1, min(j2, j1 + 3)))
        line = (f"{tag} real[{i1}:{i2}] ({i2 - i1}) vs traced[{j1}:{j2}] ({j2 - j1}): real {real_part or '-'} | "
                f"traced {ours_part or '-'}")
        if not first:
            first = line
        if len(diffs) < show_diff:
            diffs.append(line)
    return Comparison(rb.recording, len(real_big), len(ours_big), matched, matched / max(len(real_big), 1), first,
                      replayed.peak_allocated_bytes, peak_allocated, replayed.peak_reserved_bytes,
                      peak_reserved, seconds, diffs, tuning)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="recording names (or a part of them)")
    ap.add_argument("--json", help="write the comparisons as JSON lines here")
    ap.add_argument("--show-diff", type=int, default=0, metavar="N", help="print the first N differences of each")
    args = ap.parse_args()
    if not SHARED.is_dir():
        print(f"no recordings at {SHARED}", file=sys.stderr)
        return 2
    todo = [rb for rb in REBUILT if not args.only or any(o in rb.recording for o in args.only)]
    if any(rb.compiled for rb in todo) and _fake_cuda_guard.ensure():
        print(f"torch {torch.__version__} (no driver): a no-op CUDA device guard registered for Dynamo "
              "(benchmarks/_fake_cuda_guard.py)")
    rows = []
    for rb in todo:
        c = compare(rb, args.show_diff)
        rows.append(c)
        print(f"{c.recording}: {c.matched:,} of {c.real_allocs:,} real allocations >= 1 KiB matched in order "
              f"({100 * c.matched_fraction:.2f}%; traced {c.traced_allocs:,}); peak allocated "
              f"{_mib(c.traced_peak_allocated)} MiB vs {_mib(c.real_peak_allocated)} MiB "
              f"({100 * c.peak_error:+.3f}%), reserved {_mib(c.traced_peak_reserved)} vs "
              f"{_mib(c.real_peak_reserved)} MiB; traced in {c.seconds:.1f} s"
              + (f"; {c.autotuning_allocs:,} allocations of Triton's autotuning set aside" if c.autotuning_allocs
                 else ""), flush=True)
        if rb.compiled and rb.torch and not torch.__version__.startswith(rb.torch + "."):
            print(f"  note: compiled by torch {torch.__version__}'s Inductor; the recording's was {rb.torch}'s, "
                  f"whose schedule `make recordings-compiled` traces")
        if c.first_divergence:
            print(f"  first divergence: {c.first_divergence}")
        for d in c.diffs[1:]:
            print(f"  {d}")
    if args.json:
        with open(args.json, "w") as f:
            for c in rows:
                f.write(json.dumps(asdict(c)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
