"""Run one workload script in this (fresh) process and record its device memory.

Started by gpu_groundtruth.py as `python benchmarks/_gpu_recorder.py SPEC.json
RESULT.json`, one process per run, so each run pays its own CUDA init and
allocator settings from the environment take effect.  Failures inside the
workload (OOM included) end up in the record's `error`; the process still
exits 0 so the orchestrator can tell a workload error from a crashed recorder.
"""
from __future__ import annotations

import builtins
import json
import os
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._snapshot_trim import WhereFinder, store_snapshot, trim_snapshot  # noqa: E402
from xmem_engine.overrides import as_set_text, parse_script, top_level_literals  # noqa: E402

if TYPE_CHECKING:  # the probe imports torch; the orchestrator imports this module only for RecorderSpec
    from benchmarks._probe import Probe


@dataclass
class RecorderSpec:
    """What the orchestrator asks of one recorder process (serialised as JSON)."""

    run: str
    script: str
    overrides: dict[str, Any]
    snapshot_path: str
    dry_run: bool = False
    max_entries: int = 1_000_000
    inline_limit: int = 64 * 1024
    file_limit: int = 2 * 1024 * 1024
    sample_interval_s: float = 0.005
    where_files: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.script = str(Path(self.script).resolve())  # snapshot frames carry absolute paths


def describe_error(exc: BaseException, stage: str) -> dict[str, Any]:
    """JSON-able error description; the traceback tail is enough to locate it."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {"stage": stage, "type": type(exc).__name__, "message": str(exc)[:2000], "traceback": tb[-4000:]}


def _run_script(code: Any, script: str, probe: Probe, globs: dict[str, Any]) -> None:
    """Execute the compiled script as __main__, importing its siblings like `python script.py` would.

    The caller owns `globs`, so the script's model and optimizer state are still
    alive when the snapshot's segments are taken (as at the end of a real loop).
    """
    saved_path, saved_argv = list(sys.path), sys.argv
    sys.path.insert(0, os.path.dirname(script))
    sys.argv = [script]
    try:
        with probe.workload_context():
            exec(code, globs)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
    finally:
        sys.path[:], sys.argv = saved_path, saved_argv


def record_run(spec: RecorderSpec, probe: Probe) -> dict[str, Any]:
    """Measure one run; every stage that fails is reported in `error`, never raised."""
    rec: dict[str, Any] = {"run": spec.run, "script": spec.script, "overrides": spec.overrides,
                           "dry_run": spec.dry_run, "error": None}
    before = probe.used_before_init()  # must come before anything touches the device
    mem: dict[str, Any] = {"used_before_init": before.value, "used_before_init_source": before.source}
    rec["device_memory"] = mem
    try:
        # the same change as `xmem estimate --set` makes (compare_groundtruth.py estimates it)
        tree = parse_script(spec.script, {k: as_set_text(v) for k, v in spec.overrides.items()})
        rec["knobs"] = top_level_literals(tree)
        code = compile(tree, spec.script, "exec")
    except Exception as exc:
        rec["error"] = describe_error(exc, "overrides")
        return rec
    try:
        t0 = time.perf_counter()
        mem["used_after_init"], mem["total"] = probe.init_device()
        rec["init_s"] = round(time.perf_counter() - t0, 3)
        mem["used_after_init_sampler"] = probe.device_used()
        mem["sampler_source"] = probe.sampler_source
        rec["env"] = probe.environment()
    except Exception as exc:
        rec["error"] = describe_error(exc, "init")
        return rec

    from benchmarks._probe import MemorySampler

    sampler = MemorySampler(probe, spec.sample_interval_s)
    globs: dict[str, Any] = {"__name__": "__main__", "__file__": spec.script, "__builtins__": builtins}
    t0 = time.perf_counter()
    with sampler:
        probe.start_history(spec.max_entries)
        try:
            _run_script(code, spec.script, probe, globs)
            probe.synchronize()
        except BaseException as exc:  # OOM, bad override values, anything the script raises
            rec["error"] = describe_error(exc, "workload")
            del exc
    rec["workload_s"] = round(time.perf_counter() - t0, 3)
    mem.update(peak_used=sampler.peak, samples=sampler.samples, sampler_errors=sampler.errors,
               sample_interval_s=spec.sample_interval_s)
    try:
        probe.synchronize()
        mem["used_end"] = probe.mem_get_info_used()
        rec["allocator"] = probe.allocator_stats()
        raw = probe.snapshot()
        probe.stop_history()
        where = WhereFinder([spec.script, *spec.where_files])
        rec.update(store_snapshot(trim_snapshot(raw, where), Path(spec.snapshot_path),
                                  spec.inline_limit, spec.file_limit))
    except Exception as exc:
        rec["collect_error"] = describe_error(exc, "collect")
    globs.clear()
    return rec


def main(argv: list[str]) -> int:
    spec_path, result_path = argv
    spec = RecorderSpec(**json.loads(Path(spec_path).read_text()))
    from benchmarks._probe import CudaProbe, DryRunProbe
    probe: Probe = DryRunProbe() if spec.dry_run else CudaProbe()
    rec = record_run(spec, probe)
    rec["spec"] = {k: v for k, v in asdict(spec).items() if k not in ("run", "script", "overrides", "dry_run")}
    Path(result_path).write_text(json.dumps(rec, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
