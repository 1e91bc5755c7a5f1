"""The batch-size variable, the cell's line numbers, the progress indicator."""

from __future__ import annotations

import time
import traceback
import types

import pytest

from xmem_jupyter.batching import (BatchSpecError, current_batch, default_batch_values, parse_batch_values,
                                   with_batch)
from xmem_jupyter.cellcode import compile_cell


def test_batch_values():
    assert parse_batch_values("8,16,32") == [8, 16, 32]
    assert parse_batch_values("32, 8") == [8, 32]
    assert parse_batch_values("8:128") == [8, 16, 32, 64, 128]
    assert parse_batch_values("8:32:8") == [8, 16, 24, 32]
    for bad in ("", "0,8", "8:x", "64:8", "1:2:3:4", "8:16:0"):
        with pytest.raises(BatchSpecError):
            parse_batch_values(bad)
    assert default_batch_values(64) == [8, 16, 32, 64, 128, 256, 512]
    assert 3 in default_batch_values(3)


def test_with_batch_keeps_line_numbers():
    src = "\nimport torch\nbatch = 64  # per GPU\nx = dict(a=1,\n         b=2)\nprint(batch)\n"
    out, assigned = with_batch(src, "batch", 128)
    assert assigned and out.splitlines()[2] == "batch = 128  # per GPU"
    assert out.count("\n") == src.count("\n")
    multi, _ = with_batch("b = (1 +\n     2)\ny = b\n", "b", 5)
    assert multi.splitlines() == ["b = (5)", "", "y = b"]  # the parentheses stay: still valid
    assert with_batch("x = 1\n", "batch", 4) == ("x = 1\n", False)
    assert current_batch(src, "batch", {}) == 64
    assert current_batch("x = 1", "batch", {"batch": 12}) == 12
    assert current_batch("x = 1", "batch", {"batch": True}) is None
    assert current_batch("batch = 0", "batch", {}) is None and current_batch("x = 1", "batch", {"batch": -4}) is None


def test_the_slider_changes_what_set_changes():
    """One rewriter (``overrides.rewrite_source``) for ``--set`` and the slider: every top-level
    assignment, one under ``if __name__ == "__main__":`` too (a cell runs as ``__main__``);
    the slider used to change the first only, and the cell ran its own later value."""
    src = "batch = 8\nif __name__ == '__main__':\n    batch = 16\nprint(batch)\n"
    out, assigned = with_batch(src, "batch", 64)
    assert assigned and out.splitlines() == ["batch = 64", "if __name__ == '__main__':", "    batch = 64",
                                             "print(batch)"]
    ns: dict = {}
    exec(compile(out, "<cell>", "exec"), {"__name__": "__main__"}, ns)
    assert ns["batch"] == 64
    assert current_batch(src, "batch", {}) == 16  # what the cell runs with now
    twice, _ = with_batch("batch = 8\nx = 1\nbatch = 12\n", "batch", 4)
    assert twice == "batch = 4\nx = 1\nbatch = 4\n"


def test_iterations_keep_cell_line_numbers():
    src = "\nn = 0\nn += 1\nraise ValueError(n)\n"
    code = compile_cell(src, "In[42]", iterations=3)
    ns: dict = {}
    with pytest.raises(ValueError) as info:
        exec(code, ns)
    frame = traceback.extract_tb(info.value.__traceback__)[-1]
    assert (frame.filename, frame.lineno, frame.line) == ("In[42]", 4, "raise ValueError(n)")
    frames = [f for f in traceback.extract_tb(info.value.__traceback__) if f.filename == "In[42]"]
    assert [f.lineno for f in frames] == [4]  # the loop around the statements adds no line of its own
    runs = types.SimpleNamespace(k=0)
    ns = {"runs": runs}
    exec(compile_cell("\nruns.k += 1\nn = ns_n = globals().get('ns_n', 0) + 1\n", "In[43]", iterations=3), ns)
    assert runs.k == 3  # outside a trace the whole cell is the step: it ran 3 times
    assert ns["n"] == ns["ns_n"] == 1  # plain values as one run leaves them: repeats measure, not train


def test_progress_counts_and_hides():
    from xmem_jupyter.progress import Progress

    p = Progress()
    assert p.layout.display == "none"
    p.start("tracing:", lambda: 1234, period=0.05)
    time.sleep(0.3)
    assert p.layout.display == "" and "1,234 events" in p.label.value and "tracing:" in p.label.value
    p.stop()
    assert p.layout.display == "none" and p.label.value == ""
    p.stop("interrupted")
    assert p.label.value == "interrupted" and p.layout.display == ""


def test_progress_says_when_the_trace_is_compiling():
    """A compile adds no event for a minute or more: the label says what is going on."""
    import types

    from xmem_jupyter.progress import Progress, TracerProbe

    probe, tracer = TracerProbe(), types.SimpleNamespace(events=[0] * 12, compiling=True)
    probe.setup(tracer)
    p = Progress()
    p.start("tracing on the CPU:", probe, period=0.05)
    time.sleep(0.3)
    assert "12 events; compiling for the target GPU (Inductor, on the CPU" in p.label.value
    tracer.compiling = False
    time.sleep(0.3)
    assert p.label.value.endswith("12 events")
    p.stop()


KEYWORD_CELL = """
import torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
loader = DataLoader(TensorDataset(torch.randn(1024, 512)),
                    batch_size=16, shuffle=True)
model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512)).cuda()
for step, (x,) in enumerate(loader):
    model(x.cuda()).square().mean().backward()
    if step == 1:
        break
"""


def test_the_batch_as_a_keyword_argument():
    """``DataLoader(ds, batch_size=16)`` or ``SFTConfig(per_device_train_batch_size=4)``: the
    slider changes the keyword's literal, in place, where the cell assigns no such variable."""
    out, assigned = with_batch(KEYWORD_CELL, "batch_size", 256)
    assert assigned and out.splitlines()[4] == "                    batch_size=256, shuffle=True)"
    assert out.count("\n") == KEYWORD_CELL.count("\n")
    assert current_batch(KEYWORD_CELL, "batch_size", {"batch_size": 3}) == 16  # the cell's own value first
    assert current_batch("a = f(batch_size=8)\nb = f(batch_size=9)\n", "batch_size", {}) is None  # which one?


def test_a_session_traces_a_keyword_batch_at_each_size():
    pytest.importorskip("ipywidgets")
    from xmem_jupyter.session import Session

    s = Session(source=KEYWORD_CELL, namespace={}, gpus=["T4"], batch_var="batch_size", batch=16,
                batch_values=[16, 256], filename="In[3]")
    small, big = s.estimate(16, "T4"), s.estimate(256, "T4")
    inputs = {e.shape for e in big.trace.events if e.op == "aten._to_copy.default"}
    assert (256, 512) in inputs and (16, 512) not in inputs
    assert big.peak_allocated_bytes - small.peak_allocated_bytes >= (256 - 16) * (512 + 2048) * 4
