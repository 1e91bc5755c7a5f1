import json
import os
import pickle
import subprocess
import sys

import pytest


from conftest import needs_shared_traces, TRACES
from xmem_engine.cli import main
from xmem_engine.trace import Trace, TraceEvent

MiB = 1 << 20


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@needs_shared_traces
def test_replay_check_prints_json_and_exits_0(capsys):
    code, out, _ = run(capsys, "replay", str(TRACES / "sil_mem_snapshot.pickle"), "--check")
    assert code == 0
    report = json.loads(out)
    for key in ("allocs", "address_matches", "segment_allocs", "segment_matches", "layout_identical",
                "peak_allocated_bytes", "peak_reserved_bytes"):
        assert key in report
    assert report["allocs"] == report["address_matches"] == 36
    assert report["segment_allocs"] == report["segment_matches"] == 9


@needs_shared_traces
def test_replay_alloc_conf_what_if(capsys):
    code, out, _ = run(capsys, "replay", str(TRACES / "decomfl_memory.pickle"),
                       "--alloc-conf", "expandable_segments:True")
    assert code == 0
    report = json.loads(out)
    what_if = report["what_if"]
    assert what_if["alloc_conf"] == "expandable_segments:True"
    assert what_if["reserved_saved_bytes"] == report["peak_reserved_bytes"] - what_if["peak_reserved_bytes"]


def test_replay_check_exit_3_on_mismatch(tmp_path, capsys):
    snap = {"segments": [], "device_traces": [[
        {"action": "segment_alloc", "addr": 0x7F0000000000, "size": 2 * MiB, "stream": 0},
        {"action": "alloc", "addr": 0x7F0000000200, "size": 100, "stream": 0},  # should be at the start
    ]]}
    snap["segments"] = [{"device": 0, "address": 0x7F0000000000, "total_size": 2 * MiB, "stream": 0,
                         "segment_type": "small", "blocks": [
                             {"address": 0x7F0000000000, "size": 512, "state": "inactive", "requested_size": 0},
                             {"address": 0x7F0000000200, "size": 512, "state": "active_allocated",
                              "requested_size": 100},
                             {"address": 0x7F0000000400, "size": 2 * MiB - 1024, "state": "inactive",
                              "requested_size": 0}]}]
    path = tmp_path / "bad.pickle"
    path.write_bytes(pickle.dumps(snap))
    code, out, _ = run(capsys, "replay", str(path), "--check")
    assert code == 3
    assert json.loads(out)["address_matches"] == 0


def test_replay_bad_input_exit_2(tmp_path, capsys):
    code, _, err = run(capsys, "replay", str(tmp_path / "missing.pickle"))
    assert code == 2 and "cannot read snapshot" in err
    evil = tmp_path / "evil.pickle"
    evil.write_bytes(pickle.dumps({"segments": [], "x": print}))
    code, _, err = run(capsys, "replay", str(evil))
    assert code == 2 and "refusing to load builtins.print" in err


def test_bad_alloc_conf_exit_2(tmp_path, capsys):
    events = tmp_path / "t.jsonl"
    Trace([TraceEvent("alloc", id=1, bytes=10)]).write_jsonl(events)
    code, _, err = run(capsys, "simulate", str(events), "--alloc-conf", "max_split_size_mb:10")
    assert code == 2 and "max_split_size_mb too small" in err


def test_simulate_trace_file(tmp_path, capsys):
    events = tmp_path / "t.jsonl"
    Trace([
        TraceEvent("alloc", id=1, bytes=16 * MiB, category="parameter"),
        TraceEvent("alloc", id=2, bytes=16 * MiB, category="activation"),
        TraceEvent("free", id=2),
        TraceEvent("alloc", id=3, bytes=100, category="temporary"),
    ]).write_jsonl(events)
    snap = tmp_path / "s.pickle"
    code, out, _ = run(capsys, "simulate", str(events), "--json", "--snapshot", str(snap))
    assert code == 0
    res = json.loads(out)
    assert res["peak_allocated_bytes"] == 32 * MiB
    assert res["peak_reserved_bytes"] == 32 * MiB + 2 * MiB  # two 16 MiB segments + a small one
    assert res["breakdown"] == {"parameter": 16 * MiB, "activation": 16 * MiB}
    assert snap.exists()
    code, _, _ = run(capsys, "simulate", str(events), "--capacity", "30MiB")
    assert code == 3  # out of memory


def test_console_script_entry_point():
    proc = subprocess.run([sys.executable, "-m", "xmem_engine", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "replay" in proc.stdout


def test_gpus_lists_the_catalog_and_rejects_a_bad_file(tmp_path, capsys):
    code, out, _ = run(capsys, "gpus")
    assert code == 0
    assert "A100-SXM4-40GB" in out and "NVIDIA GeForce RTX 3060" in out
    code, out, _ = run(capsys, "gpus", "--json")
    data = json.loads(out)
    assert data["H100-SXM-80GB"]["cublas_workspace_bytes"] == 32 * MiB
    assert data["RTX-4060-8GB"]["kernel_bytes"] == 50 * MiB
    bad = tmp_path / "gpus.toml"
    bad.write_text('[gpus."X"]\nname = "X"\ntotal_memory_bytes = "lots"\n')
    code, _, err = run(capsys, "gpus", "--file", str(bad))
    assert code == 2 and "total_memory_bytes" in err


def test_a_script_that_changes_folder_does_not_move_the_output_files(tmp_path, capsys, monkeypatch):
    # issue #36 item 2: the script's os.chdir made --events name the script itself
    scripts, here = tmp_path / "s", tmp_path / "run"
    scripts.mkdir(), here.mkdir()
    script = scripts / "selfchdir.py"
    text = ("import os, torch\nos.chdir(os.path.dirname(os.path.abspath(__file__)))\n"
            "x = torch.ones(1000, device='cuda')\n")
    script.write_text(text)
    monkeypatch.chdir(here)
    code, *_ = run(capsys, "trace", "../s/selfchdir.py", "--events", "selfchdir.py")
    assert code == 0 and script.read_text() == text
    assert Trace.read_jsonl(str(here / "selfchdir.py")).events
    code, *_ = run(capsys, "estimate", "../s/selfchdir.py", "--events", "events.jsonl", "--snapshot", "snap.pickle")
    assert code == 0 and (here / "events.jsonl").exists() and (here / "snap.pickle").exists()
    assert sorted(p.name for p in scripts.iterdir()) == ["selfchdir.py"]


def test_json_failures_are_one_json_object(tmp_path, capsys):
    # issue #36 item 6: usage errors and a full disk under --json printed no JSON (or lost the estimate)
    script = tmp_path / "tiny.py"
    script.write_text("import torch\nx = torch.ones(1000, device='cuda')\n")
    with pytest.raises(SystemExit) as e:
        main(["estimate", str(script), "--bogus", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert e.value.code == 2 and out["exit_code"] == 2 and "--bogus" in out["message"]
    if os.path.exists("/dev/full"):
        code, out, err = run(capsys, "estimate", str(script), "--events", "/dev/full", "--force", "--json")
        res = json.loads(out)
        assert code == 1 and res["error"] == "output_failed" and "--events /dev/full" in res["message"]
        assert res["estimate"]["fits"] is True and res["estimate"]["peak_device_bytes"] > 0


def test_ctrl_c_is_one_json_object(tmp_path, capsys, monkeypatch):
    import xmem_engine.estimate as estimate_mod

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(estimate_mod, "estimate_script", interrupted)
    script = tmp_path / "tiny.py"
    script.write_text("x = 1\n")
    code, out, err = run(capsys, "estimate", str(script), "--json")
    assert code == 1 and json.loads(out)["error"] == "interrupted" and "interrupted" in err
