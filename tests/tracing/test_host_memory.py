"""Real mode never takes the host down (host_memory.py): it stops before its tensors outgrow
the memory the machine has to spare, and ``auto`` does not start a real run that the fake
attempt showed to be too big. ``XMEM_HOST_MEMORY`` caps the budget, as a small machine would."""

from __future__ import annotations

import json

import pytest
import torch

from xmem_engine.cli import main
from xmem_engine.tracing import HostMemoryError, trace
from xmem_engine.tracing.host_memory import HostBudget, available_bytes, parse_bytes, rss_bytes

MiB = 1 << 20

BIG_REAL = """
import torch
layers = [torch.nn.Linear(4096, 4096).cuda() for _ in range(6)]   # 64 MiB each
"""

BIG_AUTO = """
import torch
layers = [torch.nn.Linear(4096, 4096).cuda() for _ in range(6)]
x = torch.randint(0, 9, (400_000,), device="cuda")
counts = torch.bincount(x)      # fake mode cannot size it: auto would need real mode
"""


def _cap(monkeypatch: pytest.MonkeyPatch, spare: int) -> None:
    monkeypatch.setenv("XMEM_HOST_MEMORY", str(rss_bytes() + spare))


@pytest.mark.parametrize("text, n", [("8G", 8 << 30), ("512M", 512 * MiB), ("1.5T", int(1.5 * (1 << 40))),
                                     ("1000", 1000), ("2GiB", 2 << 30), (" 64k ", 64 << 10)])
def test_sizes_parse(text, n):
    assert parse_bytes(text) == n


@pytest.mark.parametrize("bad", ["", "lots", "-1G", "8X", "1e9"])
def test_bad_sizes_say_what_is_expected(bad):
    with pytest.raises(ValueError, match="XMEM_HOST_MEMORY must be a size such as 8G"):
        parse_bytes(bad)


def test_the_cap_bounds_what_is_available(monkeypatch):
    _cap(monkeypatch, 100 * MiB)
    avail = available_bytes()
    assert avail is not None and avail <= 100 * MiB + 8 * MiB
    budget = HostBudget.now()
    assert budget is not None and budget.limit_bytes <= rss_bytes() + 100 * MiB + 8 * MiB


def test_real_mode_stops_before_the_host_runs_out(monkeypatch):
    _cap(monkeypatch, 200 * MiB)
    before = rss_bytes()
    with pytest.raises(HostMemoryError, match=r"real mode was stopped at <cell>:3: .*Nothing was killed") as ei:
        trace(BIG_REAL, {}, mode="real")
    assert "XMEM_HOST_MEMORY" in str(ei.value)
    assert torch._C._len_torch_function_stack() == 0
    assert rss_bytes() < before + 200 * MiB  # the real tensors are gone again
    monkeypatch.delenv("XMEM_HOST_MEMORY")
    assert trace(BIG_REAL, {}, mode="fake").mode == "fake"  # fake mode needs no host memory for them


def test_a_tensor_the_host_refuses_outright_is_real_modes_limit_not_the_codes_error():
    """More than the machine has at once (a batch-size search's first size): the CPU allocator
    refuses it, and the estimate says real mode could not hold it, not "the code raised
    RuntimeError" (a search's ``except torch.cuda.OutOfMemoryError`` did not catch it either)."""
    code = ("import torch\ntry:\n    x = torch.empty(1 << 50, dtype=torch.uint8, device='cuda')\n"
            "except torch.cuda.OutOfMemoryError:\n    pass\n")
    with pytest.raises(HostMemoryError, match=r"real mode was stopped at <cell>:3: .*fake mode"):
        trace(code, {}, mode="real")


def test_auto_does_not_start_a_real_run_the_fake_attempt_showed_too_big(monkeypatch):
    _cap(monkeypatch, 200 * MiB)
    with pytest.raises(HostMemoryError) as ei:
        trace(BIG_AUTO, {}, mode="auto")
    msg = str(ei.value)
    assert "fake mode cannot run aten.bincount.default at <cell>:5" in msg
    assert "would need more than 0.4 GiB of host memory" in msg and "it was not started" in msg


def test_auto_runs_real_mode_when_the_host_has_room(monkeypatch):
    _cap(monkeypatch, 2048 * MiB)
    tr = trace(BIG_AUTO, {}, mode="auto")
    assert tr.mode == "real" and "bincount" in tr.meta["fallback"]


def test_the_cli_reports_it_as_host_memory(monkeypatch, tmp_path, capsys):
    script = tmp_path / "big.py"
    script.write_text(BIG_REAL)
    _cap(monkeypatch, 200 * MiB)
    assert main(["estimate", str(script), "--mode", "real", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and out["error"] == "host_memory" and "Nothing was killed" in out["message"]


def test_a_bad_cap_is_bad_input(monkeypatch, tmp_path, capsys):
    script = tmp_path / "s.py"
    script.write_text("import torch\n")
    monkeypatch.setenv("XMEM_HOST_MEMORY", "lots")
    assert main(["estimate", str(script)]) == 2
    assert "XMEM_HOST_MEMORY must be a size such as 8G or 512M, not 'lots'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="XMEM_HOST_MEMORY"):
        trace("import torch\nx = torch.ones(3)\n", {}, mode="real")
