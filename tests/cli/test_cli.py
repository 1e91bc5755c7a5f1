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


def test_os_exit_keeps_the_exit_contract_and_atexit_output_stays_off_the_json(tmp_path, capsys):
    # issue #36 item 1: os._exit(0) after allocating 1 TiB gave exit 0 and no answer; os._exit(7) exit 7
    script = tmp_path / "oexit.py"
    body = ("import torch, os, atexit\natexit.register(print, 'bye from atexit')\n"
            "x = torch.empty(2**40, dtype=torch.uint8, device='cuda')\n")
    script.write_text(body + "os._exit(0)\n")
    code, out, _ = run(capsys, "estimate", str(script), "--json")
    assert code == 3 and json.loads(out)["fits"] is False  # os._exit skips atexit, as it does in Python
    script.write_text(body + "os._exit(7)\n")
    code, out, _ = run(capsys, "estimate", str(script), "--json")
    assert code == 1 and json.loads(out)["script_exit_status"] == 7
    assert "ended the process with os._exit(7)" in json.loads(out)["message"]
    import atexit

    before = atexit._ncallbacks()
    script.write_text(body.replace("2**40", "2**20"))  # ends normally: the handler runs, off stdout's JSON
    code, out, err = run(capsys, "estimate", str(script), "--json")
    assert code == 0 and json.loads(out)["fits"] and "bye from atexit" in err
    assert atexit._ncallbacks() == before  # nothing of the script's is left for xmem's own exit


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
    assert code == 1 and json.loads(out)["error"] == "interrupted" and err.count("interrupted") == 1


def _xmem(*argv, **kw):
    """The ``xmem`` command as a user runs it (a script command then runs in a child process)."""
    return subprocess.run([sys.executable, "-m", "xmem_engine", *argv], capture_output=True, text=True,
                          timeout=300, **kw)


def test_a_script_that_kills_its_own_process_gets_the_contracts_answer(tmp_path):
    # issue #36 item 1: a signal (or a dying interpreter) ended xmem with it: no answer, no JSON
    script = tmp_path / "kill.py"
    script.write_text("import torch, os, signal\nx = torch.ones(10, device='cuda')\n"
                      "os.kill(os.getpid(), signal.SIGKILL)\n")
    p = _xmem("estimate", str(script), "--json")
    out = json.loads(p.stdout)
    assert p.returncode == 1 and out["error"] == "script_failed" and "signal 9 (SIGKILL)" in out["message"]
    ok = tmp_path / "ok.py"  # and a script that ends well answers as before, one JSON object on stdout
    ok.write_text("import torch, atexit\natexit.register(print, 'from atexit')\nx = torch.ones(10, device='cuda')\n")
    p = _xmem("estimate", str(ok), "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["fits"] is True and "from atexit" in p.stderr


def test_ctrl_c_from_the_terminal_gives_one_json_object(tmp_path):
    import signal
    import time

    script = tmp_path / "slow.py"
    script.write_text("import time, torch\nx = torch.ones(10, device='cuda')\nprint('started', flush=True)\n"
                      "time.sleep(60)\n")
    # a terminal's Ctrl-C reaches a process that takes SIGINT: a test run started in the
    # background by a shell without job control (``cmd &``) hands its children SIGINT ignored
    proc = subprocess.Popen([sys.executable, "-m", "xmem_engine", "estimate", str(script), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    line = ""
    while "started" not in line and time.monotonic() < deadline:
        line = proc.stderr.readline()
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends: the whole foreground group
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and json.loads(out)["error"] == "interrupted", (out, err)
    assert "xmem estimate: xmem estimate" not in err  # said once, with one prefix
