"""The notebook's torch.compile toggle (issue #32 item 4): a cell that compiles is shown compiled
for the GPU, and the toggle shows the same cell eager, with what compiling saves.

Runs where Inductor can write CUDA code and the widgets are installed (`make test-finetune`'s
environment: PyPI's CUDA wheel with Triton); elsewhere it skips, and the toggle stays hidden
(checked below on any torch)."""

from __future__ import annotations

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("jupyter_bokeh")

from tests.tracing.test_torch_compile import POINTWISE_MLP  # noqa: E402
from xmem_engine.tracing.compiler.torch_compile import compile_unavailable  # noqa: E402
from xmem_jupyter.flame import human  # noqa: E402
from xmem_jupyter.session import Session  # noqa: E402
from xmem_jupyter.widget import XmemWidget  # noqa: E402

GPU = "H100-SXM-80GB"
# one compiled training step (also the browser test's cell: tests/browser/test_browser_compile.py)
COMPILED_STEP = POINTWISE_MLP + """model = torch.compile(MLP().cuda())
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(4096, 1024, device="cuda")
model(x).square().mean().backward()
opt.step()
opt.zero_grad()
"""
CELL = "\n" + COMPILED_STEP + "steps += 1\n"
needs_inductor = pytest.mark.skipif(compile_unavailable() is not None,
                                    reason=f"Inductor cannot compile for CUDA here: {compile_unavailable()}")


@needs_inductor
def test_the_toggle_shows_the_cell_eager_and_what_compiling_saves():
    ns = {"steps": 10}
    s = Session(source=CELL, namespace=ns, gpus=[GPU], filename="In[4]")
    compiled = s.estimate(None, GPU)
    assert compiled.trace.meta["compile"]["graphs"] == 1
    assert ns["steps"] == 11  # the first trace hands back the cell's plain values, once
    w = XmemWidget(compiled, session=s)
    assert w.compile_toggle.layout.display is None and w.compile_toggle.value is True

    w.compile_toggle.value = False
    eager = w.est
    assert w.session is not s and w.session.compile == "eager"
    assert any("ran eagerly (asked: --compile eager)" in n for n in eager.notes), eager.notes
    assert "aten.gelu.default" in {e.op for e in eager.trace.events}
    assert eager.peak_device_bytes > compiled.peak_device_bytes
    saved = eager.peak_device_bytes - compiled.peak_device_bytes
    assert "torch.compile saves" in w.compile_note.value and human(saved) in w.compile_note.value, \
        (w.compile_note.value, saved)
    assert ns["steps"] == 11  # the eager trace ran in a copy of the namespace

    traces = dict(s.traces)
    w.compile_toggle.value = True  # back: the compiled session as it was, nothing traced again
    assert w.session is s and w.est is compiled and s.traces == traces
    assert "torch.compile saves" in w.compile_note.value


def test_a_cell_that_does_not_compile_has_no_toggle():
    s = Session(source=CELL.replace("torch.compile(MLP().cuda())", "MLP().cuda()"), namespace={"steps": 0}, gpus=[GPU])
    w = XmemWidget(s.estimate(None, GPU), session=s)
    assert w.compile_toggle.layout.display == "none"


def test_compile_eager_is_asked_from_the_magic():
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()
    ip.run_line_magic("load_ext", "xmem_jupyter")
    ip.user_ns["steps"] = 0
    ip.run_cell_magic("xmem", f"--gpu {GPU} --quiet --compile eager -o est", CELL)
    est = ip.user_ns["est"]
    assert any("ran eagerly (asked: --compile eager)" in n for n in est.notes), est.notes
