"""`xmem estimate`: the command a scheduler or a user at a terminal runs."""

import json
from pathlib import Path

import pytest

from xmem_engine.cli import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = str(REPO / "examples" / "train_cnn.py")


def run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse's own usage errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_estimate_json_fields_and_exit_code(capsys):
    code, out, _ = run(capsys, "estimate", EXAMPLE, "--gpu", "A100-40GB", "--iterations", "2", "--json",
                       "--set", "batch_size=8")
    assert code == 0
    res = json.loads(out)
    for key in ("gpu", "capacity_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "context_bytes",
                "outside_allocator_bytes", "peak_device_bytes", "fits", "mode", "seconds", "n_events", "breakdown"):
        assert key in res
    assert res["fits"] is True and res["gpu"] == "A100-SXM4-40GB"
    assert res["peak_device_bytes"] == res["context_bytes"] + res["outside_allocator_bytes"] + res["peak_reserved_bytes"]


def test_batch_override_changes_the_estimate(capsys):
    small = json.loads(run(capsys, "estimate", EXAMPLE, "--json", "--iterations", "1", "--set", "batch_size=4")[1])
    big = json.loads(run(capsys, "estimate", EXAMPLE, "--json", "--iterations", "1", "--set", "batch_size=64")[1])
    assert big["breakdown"].get("activation", 0) > 8 * small["breakdown"].get("activation", 0)
    assert big["breakdown"]["parameter"] == small["breakdown"]["parameter"]


def test_does_not_fit_exits_3(capsys):
    code, out, _ = run(capsys, "estimate", EXAMPLE, "--gpu", "RTX 4060", "--iterations", "1",
                       "--set", "batch_size=4096")
    assert code == 3
    assert "does not fit (short by" in out


def test_max_batch(capsys):
    code, out, _ = run(capsys, "estimate", EXAMPLE, "--gpu", "RTX 4060", "--iterations", "1", "--max-batch",
                       "batch_size", "--json")
    assert code == 0
    res = json.loads(out)
    best = res["max_value"]
    assert best > 0 and res["fits"]
    over = json.loads(run(capsys, "estimate", EXAMPLE, "--gpu", "RTX 4060", "--iterations", "1", "--json",
                          "--set", f"batch_size={best + 1}")[1])
    assert not over["fits"]


def test_max_batch_of_a_script_that_tests_the_batch_for_a_value(tmp_path, capsys):
    # the test is a guard of the symbolic trace (even sizes): an odd size gets a symbolic trace
    # of its own; the answer is the real traces' (it fits, the size above does not)
    script = tmp_path / "odd.py"
    script.write_text("import torch\nbatch_size = 8\nif batch_size % 2:\n    extra = torch.empty(2**28, device='cuda')\n"
                      "x = torch.empty(batch_size, 2**20, device='cuda')\n")
    res = json.loads(run(capsys, "estimate", str(script), "--gpu", "T4", "--max-batch", "batch_size", "--json")[1])
    assert len(res["traced"]) == 2 and res["traced"][0] == 8 and res["traced"][1] % 2 == 1
    assert "broke a guard of the trace at 8" in res["family"]
    v = res["max_value"]
    fits = [json.loads(run(capsys, "estimate", str(script), "--gpu", "T4", "--set", f"batch_size={b}", "--json")[1])["fits"]
            for b in (v, v + 1)]
    assert fits == [True, False]


@pytest.mark.parametrize("argv, fragment", [
    (["--gpu", "B9000"], "unknown GPU"),
    (["--set", "batchsize=3"], "batchsize"),
    (["--alloc-conf", "max_split_size_mb:1"], "max_split_size_mb"),
    (["--iterations", "0"], "--iterations"),
    (["--torch", "banana"], "PyTorch version"),
])
def test_bad_input_exits_2(capsys, argv, fragment):
    code, _, err = run(capsys, "estimate", EXAMPLE, *argv)
    assert code == 2
    assert fragment.lower() in err.lower()


def test_failing_script_exits_1_with_its_traceback(tmp_path, capsys):
    script = tmp_path / "broken.py"
    script.write_text("import torch\nx = torch.ones(3, device='cuda')\ny = x @ torch.ones(4, 4, device='cuda')\n")
    code, _, err = run(capsys, "estimate", str(script))
    assert code == 1
    assert "broken.py" in err and "line 3" in err
    assert "xmem_engine" not in err.split("xmem estimate:")[0]  # the user's frames only


def test_snapshot_and_events_outputs(tmp_path, capsys):
    snap, events = tmp_path / "s.pickle", tmp_path / "e.jsonl"
    code, _, _ = run(capsys, "estimate", EXAMPLE, "--iterations", "1", "--set", "batch_size=4",
                     "--snapshot", str(snap), "--events", str(events))
    assert code == 0
    from xmem_engine.simulation.snapshot import load_snapshot

    s = load_snapshot(snap)
    assert s["segments"] and s["device_traces"][0]
    lines = events.read_text().splitlines()
    assert json.loads(lines[0])["kind"]


def test_min_memory_flag_adds_the_least_device_memory(capsys):
    argv = ("estimate", EXAMPLE, "--gpu", "A100-40GB", "--iterations", "2", "--set", "batch_size=8")
    plain = json.loads(run(capsys, *argv, "--json")[1])
    code, out, _ = run(capsys, *argv, "--json", "--min-memory")
    res = json.loads(out)
    assert code == 0 and plain["min_device_bytes"] is None
    assert res["context_bytes"] + res["outside_allocator_bytes"] + res["peak_allocated_bytes"] \
        <= res["min_device_bytes"] <= res["peak_device_bytes"]
    code, out, _ = run(capsys, *argv, "--min-memory")
    assert "runs in as little as" in out


def test_the_script_gets_its_own_arguments_after_a_bare_dash_dash(tmp_path, capsys):
    """``xmem estimate train.py -- 50 --lr 3``: the script's argparse sees ``50 --lr 3``."""
    script = tmp_path / "args.py"
    script.write_text("import argparse, sys, torch\n"
                      "p = argparse.ArgumentParser(); p.add_argument('n', type=int); p.add_argument('--lr')\n"
                      "a = p.parse_args()\n"
                      "x = torch.empty(a.n, 2**20, device='cuda')\n"
                      "print('ARGS', sys.argv[1:])\n")
    assert main(["estimate", str(script), "--gpu", "T4", "--json", "--", "50", "--lr", "3"]) == 0
    out, err = capsys.readouterr()
    assert "ARGS ['50', '--lr', '3']" in err  # the script's prints go to stderr with --json
    assert json.loads(out)["peak_allocated_bytes"] >= 50 * 2**22
    with pytest.raises(SystemExit) as e:  # argparse's usage error, as for any unknown argument
        main(["gpus", "--", "x"])
    assert e.value.code == 2 and "takes no script arguments" in capsys.readouterr().err
