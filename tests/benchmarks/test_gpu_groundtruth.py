"""Dry-run checks of the GPU ground-truth recorder (benchmarks/gpu_groundtruth.py).

The real thing needs CUDA; these run the same orchestration, override,
recording, trimming and JSON-writing code on the CPU through DryRunProbe.
"""
from __future__ import annotations

import gzip
import json
import textwrap
from pathlib import Path

import pytest

from benchmarks import gpu_groundtruth as gt
from benchmarks._gpu_recorder import RecorderSpec, record_run
from benchmarks._snapshot_trim import WhereFinder, load_snapshot, store_snapshot, trim_snapshot
from xmem_engine.overrides import (OverrideError, apply_overrides, as_set_text, load_script, parse_script,
                                   top_level_literals)
from benchmarks.workloads import WORKLOADS, RunSpec, select

SCRIPT = textwrap.dedent("""\
    import math
    batch_size = 64
    name: str = "x"
    dup = 1
    dup = 2
    a = b = 3
    def f():
        inner = 5
    result = (batch_size, name)
""")


# --------------------------------------------------------------- overrides
# A recording applies its overrides with xmem's own --set grammar (xmem_engine/overrides.py),
# so the recorded run and compare_groundtruth.py's estimate of it make the same change.
def test_override_replaces_value_and_keeps_line_numbers(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    tree = parse_script(script, {"batch_size": as_set_text(2), "name": as_set_text("y")})
    ns: dict = {}
    exec(compile(tree, str(script), "exec"), ns)
    assert ns["result"] == (2, "y")
    assert [n.lineno for n in tree.body][:3] == [1, 2, 3]
    # the knobs a recording keeps: literal assignments (the last one wins), not expressions
    assert top_level_literals(tree) == {"batch_size": 2, "name": "y", "dup": 2}


@pytest.mark.parametrize("value", [64, 2.5e-4, None, True, "bfloat16", "2", "x y", (2, 3), "'quoted'"])
def test_recorded_values_survive_the_set_grammar(tmp_path: Path, value) -> None:
    script = tmp_path / "s.py"
    script.write_text("knob = 0\n")
    ns: dict = {}
    exec(load_script(script, {"knob": as_set_text(value)}), ns)
    assert ns["knob"] == value and type(ns["knob"]) is type(value)


@pytest.mark.parametrize("overrides, match", [
    ({"nope": "1"}, "no top-level assignment to nope"),
    ({"inner": "1"}, "no top-level assignment to inner"),
    ({"math": "1"}, "no top-level assignment to math"),
    ({"a": "1"}, "chained assignment"),
])
def test_override_errors(overrides: dict, match: str) -> None:
    import ast

    with pytest.raises(OverrideError, match=match):
        apply_overrides(ast.parse(SCRIPT), overrides, "s.py")


def test_every_run_override_names_a_knob() -> None:
    for run in WORKLOADS:
        for dry in (False, True) if run.dry_runnable else (False,):
            load_script(run.script, {k: as_set_text(v) for k, v in run.effective_overrides(dry).items()})


def test_unknown_override_is_recorded_not_raised(tmp_path: Path) -> None:
    from benchmarks._probe import DryRunProbe
    spec = RecorderSpec(run="bad", script=str(select(["gpt2-small-bs8x1024-fp32"])[0].script),
                        overrides={"no_such_knob": 1}, snapshot_path=str(tmp_path / "s.json.gz"), dry_run=True)
    rec = record_run(spec, DryRunProbe())
    assert rec["error"]["stage"] == "overrides"
    assert rec["error"]["type"] == "OverrideError"
    assert "no_such_knob" in rec["error"]["message"]


def test_cuda_probe_records_init_outcome(tmp_path: Path) -> None:
    """Without CUDA the real probe must fail cleanly at init; with CUDA it must record a tiny run."""
    import torch
    from benchmarks._probe import CudaProbe
    run = select(["gpt2-small-bs8x1024-fp32"])[0]
    overrides = {k: v for k, v in run.effective_overrides(True).items() if k != "device"}
    spec = RecorderSpec(run="cuda-probe", script=str(run.script), overrides=overrides,
                        snapshot_path=str(tmp_path / "s.json.gz"), where_files=[str(run.script.parent / "models.py")])
    rec = record_run(spec, CudaProbe())
    if torch.cuda.is_available():
        assert rec["error"] is None, rec["error"]
        assert rec["allocator"]["max_memory_allocated"] > 0 and rec["snapshot_events"] > 0
    else:
        assert rec["error"]["stage"] == "init" and "CUDA is not available" in rec["error"]["message"]


def test_cuda_probe_glue_with_faked_torch_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Drive CudaProbe through record_run with torch.cuda faked, to check the glue, not the GPU."""
    import types

    import torch
    from benchmarks import _probe
    script = tmp_path / "w.py"
    script.write_text("device = 'cuda'\nbatch_size = 4\nx = [0] * batch_size\n")
    used = {"now": 1000}
    calls: list[tuple] = []
    frames = [{"filename": str(script), "line": 3, "name": "<module>"}]
    fake = {
        "is_available": lambda: True,
        "set_device": lambda d: calls.append(("set_device", d)),
        "mem_get_info": lambda d=0: (100_000 - used["now"], 100_000),
        "get_device_properties": lambda d: types.SimpleNamespace(uuid="abc", total_memory=100_000, major=9, minor=0),
        "get_device_name": lambda d=0: "NVIDIA H200",
        "reset_peak_memory_stats": lambda d=0: calls.append(("reset",)),
        "synchronize": lambda d=0: None,
        "memory_stats": lambda d=0: {"num_alloc_retries": 1, "num_ooms": 0, "num_device_alloc": 7},
        "max_memory_allocated": lambda d=0: 512,
        "max_memory_reserved": lambda d=0: 2 << 20,
        "memory_allocated": lambda d=0: 256,
        "memory_reserved": lambda d=0: 2 << 20,
    }
    for name, fn in fake.items():
        monkeypatch.setattr(torch.cuda, name, fn)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda *a, **k: calls.append(("history", a, k)))
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda *a, **k: {
        "segments": [{"device": 0, "address": 0, "total_size": 2 << 20, "stream": 0, "segment_type": "large",
                      "blocks": [{"address": 0, "size": 512, "requested_size": 500, "state": "active_allocated",
                                  "frames": frames}]}],
        "device_traces": [[{"action": "alloc", "addr": 0, "size": 512, "stream": 0, "frames": frames}]]})
    monkeypatch.setattr(_probe, "nvidia_smi", lambda field: {"memory.used": "1", "driver_version": "999.1"}[field])
    monkeypatch.setattr(_probe.Nvml, "open", classmethod(lambda cls: None))
    spec = RecorderSpec(run="fake", script=str(script), overrides={"batch_size": 2},
                        snapshot_path=str(tmp_path / "s.json.gz"))
    rec = record_run(spec, _probe.CudaProbe())
    assert rec["error"] is None and "collect_error" not in rec, rec
    assert rec["knobs"] == {"device": "cuda", "batch_size": 2}
    mem = rec["device_memory"]
    assert mem["used_before_init"] == 2**20 and mem["used_before_init_source"] == "nvidia-smi"
    assert mem["used_after_init"] == 1000 and mem["total"] == 100_000 and mem["sampler_source"] == "mem_get_info"
    assert rec["env"]["gpu_name"] == "NVIDIA H200" and rec["env"]["driver_version"] == "999.1"
    assert rec["env"]["compute_capability"] == "9.0" and rec["env"]["gpu_uuid"] == "abc"
    assert rec["allocator"]["max_memory_reserved"] == 2 << 20
    assert rec["allocator"]["memory_stats"]["num_alloc_retries"] == 1
    assert rec["snapshot"]["device_traces"] == [{"action": "alloc", "addr": 0, "size": 512, "stream": 0,
                                                 "where": "w.py:3:<module>"}]
    history = [c for c in calls if c[0] == "history"]
    assert history[0][2]["max_entries"] == spec.max_entries and history[-1][1] == (None,)


# ------------------------------------------------------------------- trimming
def _frames(*where: tuple[str, int, str]) -> list[dict]:
    return [{"filename": f, "line": line, "name": n} for f, line, n in where]


def test_trim_keeps_innermost_workload_frame(tmp_path: Path) -> None:
    script, models = tmp_path / "w.py", tmp_path / "models.py"
    script.write_text(""), models.write_text("")
    inner = _frames(("/torch/nn/linear.py", 10, "forward"), (str(models), 7, "forward"), (str(script), 3, "<module>"))
    snap = {
        "device_traces": [[
            {"action": "alloc", "addr": 16, "size": 512, "stream": 0, "frames": inner, "time_us": 1},
            {"action": "oom", "size": 1 << 40, "stream": 0, "device_free": 5, "frames": _frames(("/x.py", 1, "f"))},
        ]],
        "segments": [{"device": 0, "address": 0, "total_size": 2 << 20, "stream": 0, "segment_type": "large",
                      "frames": inner, "blocks": [{"address": 0, "size": 512, "requested_size": 500,
                                                   "state": "active_allocated", "frames": inner}]}],
    }
    t = trim_snapshot(snap, WhereFinder([script, models]))
    assert t["device_traces"][0] == {"action": "alloc", "addr": 16, "size": 512, "stream": 0,
                                     "where": "models.py:7:forward"}
    assert t["device_traces"][1]["where"] is None and t["device_traces"][1]["device_free"] == 5
    assert t["segments"][0]["blocks"] == [{"address": 0, "size": 512, "requested_size": 500,
                                           "state": "active_allocated"}]
    assert "frames" not in t["segments"][0]


def test_store_snapshot_inline_file_and_cut(tmp_path: Path) -> None:
    events = [{"action": "alloc", "addr": i * 4096, "size": 4096 + i, "stream": 0, "where": f"w.py:{i}:f"}
              for i in range(20000)]
    trimmed = {"device_traces": events, "segments": []}
    small = store_snapshot({"device_traces": events[:3], "segments": []}, tmp_path / "a.json.gz", 10_000, 10**6)
    assert small["snapshot"]["device_traces"] == events[:3] and small["snapshot_file"] is None
    big = store_snapshot(trimmed, tmp_path / "b.json.gz", 10_000, 10**7)
    assert big["snapshot_events_dropped"] == 0
    assert load_snapshot(big)["device_traces"] == events
    cut = store_snapshot(trimmed, tmp_path / "c.json.gz", 10_000, 20_000)
    assert Path(cut["snapshot_file"]).stat().st_size <= 20_000
    kept = json.loads(gzip.decompress(Path(cut["snapshot_file"]).read_bytes()))
    assert 0 < len(kept["device_traces"]) == 20000 - cut["snapshot_events_dropped"] < 20000
    assert kept["device_traces"] == events[:len(kept["device_traces"])]


# ------------------------------------------------------------------ dry run
@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    tmp = tmp_path_factory.mktemp("gt")
    failing = tmp / "failing.py"
    failing.write_text("import torch\ndevice = 'cuda'\nx = torch.ones(1000, device=device)\n"
                       "raise RuntimeError('deliberate failure')\n")
    crashing = tmp / "crashing.py"
    crashing.write_text("import os\ndevice = 'cuda'\nos._exit(3)\n")
    runs = select(["gpt2-small-bs8x1024-bf16-ckpt", "bert-base-bs16x512-adamw"]) + [
        RunSpec("failing", failing, env={"XMEM_TEST_ENV": "1"}),
        RunSpec("crashing", crashing),
    ]
    opts = gt.Options(out_dir=tmp / "out", dry_run=True, timeout_s=120, inline_limit=1024)
    jsonl, records = gt.run_all(runs, opts, "cpu-dry-run")
    return jsonl, records


@pytest.mark.slow
def test_dry_run_writes_one_line_per_run(dry_run: tuple[Path, list[dict]]) -> None:
    jsonl, records = dry_run
    assert jsonl.name.startswith("gpu_groundtruth-cpu-dry-run-") and jsonl.suffix == ".jsonl"
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [r["run"] for r in lines] == ["gpt2-small-bs8x1024-bf16-ckpt", "bert-base-bs16x512-adamw",
                                         "failing", "crashing"]
    assert lines == json.loads(json.dumps(records, default=str))
    assert all(r["schema"] == gt.SCHEMA_VERSION and r["dry_run"] is True for r in lines)


@pytest.mark.slow
def test_dry_run_successful_records(dry_run: tuple[Path, list[dict]]) -> None:
    jsonl, records = dry_run
    for rec in records[:2]:
        assert rec["error"] is None, rec["error"]
        assert rec["overrides"]["device"] == "cpu" and rec["overrides"]["batch_size"] == 2
        env = rec["env"]
        assert {"gpu_name", "driver_version", "torch_version", "cuda_version", "cudnn_version"} <= set(env)
        assert env["gpu_name"] == "cpu-dry-run" and isinstance(env["torch_version"], str)
        mem = rec["device_memory"]
        for key in ("used_before_init", "used_after_init", "peak_used", "total", "used_end"):
            assert isinstance(mem[key], int) and mem[key] > 0, key
        assert mem["samples"] >= 2 and mem["peak_used"] >= mem["used_before_init"]
        alloc = rec["allocator"]
        assert alloc["max_memory_allocated"] > 0 and alloc["max_memory_reserved"] >= alloc["max_memory_allocated"]
        assert set(alloc["memory_stats"]) >= {"num_alloc_retries", "num_ooms", "num_device_alloc"}
        assert alloc["memory_stats"]["num_device_alloc"] > 0
        assert rec["returncode"] == 0 and "3 iterations" in rec["stdout_tail"]
        assert rec["snapshot"] is None and not Path(rec["snapshot_file"]).is_absolute()
        snap = load_snapshot(rec, jsonl.parent)
        assert len(snap["device_traces"]) == rec["snapshot_events"] > 0
        ev = snap["device_traces"][0]
        assert set(ev) == {"action", "addr", "size", "stream", "where"}
        actions = {e["action"] for e in snap["device_traces"]}
        assert {"alloc", "free_requested", "free_completed"} <= actions
        wheres = {e["where"].split(":")[0] for e in snap["device_traces"] if e["where"]}
        assert wheres == {Path(rec["script"]).name, "models.py"}
        assert snap["segments"] and {"address", "total_size", "stream", "segment_type", "blocks"} <= set(
            snap["segments"][0])
    knobs = records[0]["knobs"]
    assert knobs["checkpointing"] is True and knobs["amp_dtype"] == "bfloat16" and knobs["iterations"] == 3
    assert knobs["device"] == "cpu" and knobs["vocab_size"] == 1000


@pytest.mark.slow
def test_dry_run_errors_are_captured(dry_run: tuple[Path, list[dict]]) -> None:
    _, records = dry_run
    failing, crashing = records[2], records[3]
    assert failing["error"]["stage"] == "workload"
    assert failing["error"]["type"] == "RuntimeError" and "deliberate failure" in failing["error"]["message"]
    assert "failing.py" in failing["error"]["traceback"]
    assert failing["env_vars"] == {"XMEM_TEST_ENV": "1"} and failing["overrides"] == {"device": "cpu"}
    assert failing["allocator"]["max_memory_allocated"] >= 4000  # the tensor made before the raise
    assert crashing["error"]["type"] == "RecorderCrashed" and crashing["returncode"] == 3
    table = gt.format_table(records)
    for name in ("gpt2-small-bs8x1024-bf16-ckpt", "bert-base-bs16x512-adamw", "RuntimeError", "RecorderCrashed"):
        assert name in table


def test_timeout_is_recorded(tmp_path: Path) -> None:
    script = tmp_path / "sleepy.py"
    # a `device` for the dry run to set: without it the run fails at its overrides, and fast
    script.write_text("device = 'cuda'\nimport time\ntime.sleep(60)\n")
    rec = gt.run_one(RunSpec("sleepy", script), gt.Options(out_dir=tmp_path, dry_run=True), "x", timeout_s=1)
    assert rec["error"]["stage"] == "timeout" and rec["returncode"] is None


def test_time_budget_skips_runs(tmp_path: Path) -> None:
    opts = gt.Options(out_dir=tmp_path, dry_run=True, budget_s=0)
    _, records = gt.run_all(select(["gpt2-small-bs8x1024-fp32"]), opts, "cpu-dry-run")
    assert records[0]["error"]["type"] == "TimeBudget"


def test_cli_list_and_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert gt.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(r.name in out for r in WORKLOADS) and "expandable_segments:True" in out
    assert gt.main(["--only", "no-such-run", "--dry-run"]) == 2
    assert gt.main(["--only", "zoo-lstm-tagger", "--dry-run"]) == 2  # the zoo's scripts need a GPU
    assert "cannot be dry-run" in capsys.readouterr().err


def test_runs_cover_the_issue() -> None:
    names = {r.name for r in WORKLOADS}
    assert {"resnet50-bs64-sgd", "resnet50-bs64-adamw", "vit-b16-bs32-adamw", "bert-base-bs16x512-adamw",
            "gpt2-small-bs8x1024-fp32", "gpt2-small-bs8x1024-bf16", "gpt2-small-bs8x1024-fp32-ckpt"} <= names
    assert any(r.env.get("PYTORCH_CUDA_ALLOC_CONF") == "expandable_segments:True" for r in WORKLOADS)
    assert all(r.overrides.get("iterations", 3) == 3 for r in WORKLOADS)


# ------------------------------------------------------- fixed memory, stage by stage (issue #37)
def test_fixed_memory_table_subtracts_what_the_allocator_reserved() -> None:
    """Each stage's part is the device memory it added less the allocator's growth in it; NVML's
    device-wide reading where there is one (the only one before CUDA exists)."""
    MiB = 1 << 20
    R = gt.StageReading
    readings = [
        R("before_init", 10 * MiB, None, None, None, 0),
        R("context", 510 * MiB, 480 * MiB, 500 * MiB, 80_000 * MiB, 2 * MiB),       # +500, 2 of it tensors
        R("first_matmul", 700 * MiB, 480 * MiB, 690 * MiB, 80_000 * MiB, 100 * MiB),  # +190, 98 of it allocator
        R("first_convolution", 900 * MiB, 480 * MiB, 890 * MiB, 80_000 * MiB, 150 * MiB),
        R("process_group", 1400 * MiB, 480 * MiB, 1390 * MiB, 80_000 * MiB, 160 * MiB),
    ]
    table = gt.fixed_memory_table(readings)
    assert table == {"context_bytes": 498 * MiB, "kernel_bytes": 92 * MiB, "cudnn_bytes": 150 * MiB,
                     "nccl_bytes": 490 * MiB, "driver_reserved_bytes": 480 * MiB}
    # without NVML: mem_get_info's readings (nvidia-smi's used before CUDA init)
    no_nvml = [R(r.stage, None, None, r.cuda_used if r.stage != "before_init" else 12 * MiB, r.cuda_total,
                 r.allocator_reserved) for r in readings]
    assert gt.fixed_memory_table(no_nvml)["context_bytes"] == 500 * MiB - 12 * MiB - 2 * MiB
    # a stage that did not run (no torch.distributed) fills nothing
    assert gt.fixed_memory_table(readings[:4])["nccl_bytes"] is None
    with pytest.raises(ValueError, match="before CUDA init"):
        gt.fixed_memory_table(readings[1:])


def test_the_catalog_snippet_is_a_catalog_entry_with_sources(tmp_path: Path) -> None:
    """What --fixed-memory prints loads as a user catalog file and overrides the GPU's figures,
    which then count as measured: the estimate's range adds nothing for them."""
    from xmem_engine.gpus import load_catalog

    table = {"context_bytes": 600 << 20, "kernel_bytes": 120 << 20, "cudnn_bytes": 90 << 20, "nccl_bytes": 64 << 20,
             "driver_reserved_bytes": 480 << 20}
    versions = {"gpu_name": "NVIDIA H100 80GB HBM3", "torch": "2.13.0+cu129", "cuda": "12.9", "cudnn": 91002,
                "nccl": "2.27.3", "driver": "575.57.08", "cuda_module_loading": "LAZY", "world_size": 1}
    text = gt.catalog_snippet(table, versions, "2026-12-03")
    assert text.startswith('[gpus."H100-SXM-80GB"]')
    assert "# nccl_bytes = 67_108_864  # one rank alone" in text  # a lower bound: not written as the figure
    f = tmp_path / "gpus.toml"
    f.write_text(text + "\n")
    h100 = load_catalog(f)["H100-SXM-80GB"]
    assert (h100.context_bytes, h100.kernel_bytes, h100.cudnn_bytes) == (600 << 20, 120 << 20, 90 << 20)
    assert h100.driver_reserved_bytes == 480 << 20
    assert "driver 575.57.08, torch 2.13.0+cu129" in h100.sources["kernel_bytes"]
    for name in ("context_bytes", "kernel_bytes", "cudnn_bytes", "driver_reserved_bytes"):
        assert h100.measured(name) and h100.part_range(name) == (getattr(h100, name),) * 2, name
    assert not h100.measured("nccl_bytes")


def test_fixed_memory_dry_run_records_every_stage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gt.main(["--fixed-memory", "--dry-run", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert '[gpus."cpu-dry-run"]' in out and "kernel_bytes = " in out
    (path,) = tmp_path.glob("fixed_memory-cpu-dry-run-*.jsonl")
    rec = json.loads(path.read_text().splitlines()[-1])
    assert [r["stage"] for r in rec["readings"]] == ["before_init", *gt.STAGES]
    assert set(rec["fixed_memory"]) == {*gt.STAGE_FIELDS.values(), "driver_reserved_bytes"}
    assert rec["versions"]["torch"] and rec["kind"] == "fixed_memory"
