"""``xmem trace SCRIPT``: scripts, --set overrides, JSON lines output and exit codes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from xmem_engine.cli import main
from xmem_engine.overrides import OverrideError, parse_overrides
from xmem_engine.tracing import trace_script

SCRIPT = '''\
import torch
import torch.nn as nn

batch_size = 4
hidden: int = 32
optimizer_name = "sgd"


def make_model():
    return nn.Sequential(nn.Linear(16, hidden), nn.ReLU(), nn.Linear(hidden, 2))


if __name__ == "__main__":
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = make_model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1) if optimizer_name == "sgd" else torch.optim.Adam(model.parameters())
    for step in range(2):
        x = torch.randn(batch_size, 16, device=device)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    print(f"done {loss.item():.3f}", torch.cuda.max_memory_allocated())
'''


@pytest.fixture()
def script(tmp_path: Path) -> Path:
    p = tmp_path / "train.py"
    p.write_text(SCRIPT)
    return p


def input_bytes(events) -> list[int]:
    return [e["bytes"] for e in events if e["kind"] == "alloc" and e["category"] == "input"]


def test_trace_script_with_overrides(script):
    base = trace_script(script, mode="fake")
    big = trace_script(script, mode="fake", overrides={"batch_size": "64", "hidden": "128", "optimizer_name": "adam"})
    b_in = [e.bytes for e in base.events if e.kind == "alloc" and e.category == "input"]
    g_in = [e.bytes for e in big.events if e.kind == "alloc" and e.category == "input"]
    assert b_in == [4 * 16 * 4] * 2 and g_in == [64 * 16 * 4] * 2
    assert sum(e.bytes for e in big.events if e.kind == "alloc" and e.category == "optimizer_state") > 0
    assert not any(e.category == "optimizer_state" for e in base.events)   # SGD without momentum
    assert big.meta["overrides"]["batch_size"] == "64"


def test_overrides_must_name_a_top_level_assignment(script):
    with pytest.raises(OverrideError, match="no_such_var"):
        trace_script(script, overrides={"no_such_var": "1"})
    with pytest.raises(OverrideError, match="VAR=VALUE"):
        parse_overrides(["batch_size"])
    assert parse_overrides(["lr=1e-3", "name=a=b"]) == {"lr": "1e-3", "name": "a=b"}


def test_cli_writes_json_lines_and_a_summary(script, tmp_path, capsys):
    out = tmp_path / "events.jsonl"
    rc = main(["trace", str(script), "--mode", "fake", "--set", "batch_size=8", "--events", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    lines = out.read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert len(events) > 20
    for e in events:
        assert {"kind", "bytes", "category", "op", "module", "phase", "stream"} <= set(e)
    assert {e["kind"] for e in events} >= {"alloc", "free", "iteration", "phase"}
    assert input_bytes(events) == [8 * 16 * 4] * 2
    summary = [line for line in captured.out.splitlines() if line.startswith("xmem trace:")]
    assert len(summary) == 1 and f"{len(events):,} events" in summary[0] and "mode fake" in summary[0]
    assert " s -> " in summary[0]
    assert re.search(r"done [0-9.]+ ", captured.out)   # the script's own print ran (a guessed value)
    rc = main(["trace", str(script), "--mode", "fake", "--max-iterations", "1", "--events", str(out)])
    assert rc == 2 and "pass --force" in capsys.readouterr().err  # an existing file is kept...
    rc = main(["trace", str(script), "--mode", "fake", "--max-iterations", "1", "--events", str(out), "--force"])
    assert rc == 0  # ...unless asked
    one = [json.loads(line) for line in out.read_text().splitlines()]
    assert [e["iteration"] for e in one if e["kind"] == "iteration"] == [0] and len(one) < len(events)


def test_cli_exit_codes(script, tmp_path, capsys):
    out = tmp_path / "e.jsonl"
    assert main(["trace", str(tmp_path / "missing.py"), "--events", str(out)]) == 2
    assert main(["trace", str(script), "--set", "nope=1", "--events", str(out)]) == 2
    assert main(["trace", str(script), "--set", "oops", "--events", str(out)]) == 2
    assert main(["trace", str(script), "--max-iterations", "0", "--events", str(out)]) == 2
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nx = torch.ones(2, device='cuda')\n\ny = x.undefined_method()\n")
    capsys.readouterr()
    assert main(["trace", str(bad), "--events", str(out)]) == 1
    err = capsys.readouterr().err
    assert f'File "{bad}", line 4' in err and "AttributeError" in err and "xmem_engine" not in err
    dd = tmp_path / "dd.py"
    # bincount's size is its input's largest value: of a big unknown tensor, nothing to guess from
    dd.write_text("import torch\nx = torch.randint(0, 9, (400_000,), device='cuda')\ny = torch.bincount(x)\n")
    assert main(["trace", str(dd), "--mode", "fake", "--events", str(out)]) == 1
    err = capsys.readouterr().err
    assert "--mode real" in err and f"{dd}:3" in err
    assert main(["trace", str(dd), "--mode", "auto", "--events", str(out)]) == 0
    assert "traced in real mode" in capsys.readouterr().out


def test_python_dash_m_entry_point(script, tmp_path):
    out = tmp_path / "events.jsonl"
    proc = subprocess.run([sys.executable, "-m", "xmem_engine", "trace", str(script), "--events", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2])
    assert proc.returncode == 0, proc.stderr
    assert "mode fake" in proc.stdout and out.stat().st_size > 0


def test_sys_exit_zero_ends_a_script_normally_and_nonzero_fails(tmp_path, capsys):
    ok = tmp_path / "ok.py"
    ok.write_text("import sys, torch\n\ndef main():\n    torch.ones(4, device='cuda')\n    return 0\n\n"
                  "if __name__ == '__main__':\n    sys.exit(main())\n")
    tr = trace_script(ok, mode="fake")
    assert [e.bytes for e in tr.events if e.kind == "alloc"] == [16]
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nsys.exit(3)\n")
    out = tmp_path / "e.jsonl"
    assert main(["trace", str(bad), "--events", str(out)]) == 1
    assert "exited with status 3" in capsys.readouterr().err
