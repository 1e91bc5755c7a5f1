"""Real browser (JupyterLab + Chromium + Playwright) on the notebook front's controls and lines:

1. cell numbers: the tensor table, the flame chart's hover text and a failing cell's traceback
   name the cell by the number its prompt shows;
3. the timeline shows the GPU's capacity and the allocator's limit, is never clipped, and marks
   where a step that does not fit runs out of memory;
4. the largest batch can be applied (the slider takes it; a cell without ``--batch-var`` has
   a slider for the batch size it gives a call), GPU names are the same in the
   dropdown, the headline and the comparison, modules carry their class, and a GPU of another
   architecture is starred with the attention-backend caveat.

Skips without /usr/bin/chromium or Playwright (scripts/setup_browser.sh installs them).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.jupyter_server import CHROMIUM, CHROMIUM_ARGS, jupyter_server, needs_chromium, run_all_in_lab, write_notebook

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"

pytestmark = [pytest.mark.slow, needs_chromium]

CELLS = [
    "%load_ext xmem_jupyter",
    "import torch, torch.nn as nn, torch.nn.functional as F",
    # [3]: two GPUs of different architectures, a batch slider that stops short of the largest batch
    """%%xmem --gpu T4 --gpu H100-SXM-80GB --batch-var batch --batch-values 8:64 --max-batch
batch = 16
model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda()
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(batch, 1024, device="cuda")
q = model(x).view(batch, 8, 16, 8)
F.scaled_dot_product_attention(q, q, q).sum().backward()
opt.step()""",
    # [4]: does not fit a T4; no --batch-var, a batch size given to a call: a slider for it all the same
    """%%xmem --gpu T4
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(64, 8)), batch_size=16)
big = torch.empty(12 * 2**30, dtype=torch.uint8, device="cuda")
more = torch.empty(6 * 2**30, dtype=torch.uint8, device="cuda")""",
    # [5]: fails on its line 3
    """%%xmem --gpu T4
x = torch.ones(3, device="cuda")
y = x @ torch.ones(4, device="cuda")""",
]


@pytest.fixture()
def lab(tmp_path):
    pytest.importorskip("playwright.sync_api", reason="playwright (Python package) is not installed")
    nbdir = tmp_path / "nb"
    nbdir.mkdir()
    write_notebook(nbdir / "controls.ipynb", CELLS)
    with jupyter_server(tmp_path / "jupyter", nbdir, pythonpath=ROOT) as server:
        yield server


# Bokeh models of the page, looked up in BokehJS (the charts are drawn on canvases)
BOKEH_TEXTS_JS = """() => { const out = [];
  for (const d of (window.Bokeh && window.Bokeh.documents) || []) for (const m of d.all_models) {
    if (m.data && m.data.tip) out.push(...Array.from(m.data.tip).slice(0, 400));
  } return out; }"""
TIMELINES_JS = """() => { const out = [];
  for (const d of (window.Bokeh && window.Bokeh.documents) || []) {
    const models = Array.from(d.all_models);
    const limits = models.find(m => m.data && m.data.capacity && m.data.limit);
    const line = models.find(m => m.data && m.data.allocated && m.data.reserved);
    if (!limits || !line) continue;
    const fig = models.find(m => m.renderers && m.y_range && m.title &&
                                 String(m.title.text || '').startsWith('Allocator memory'));
    const oom = models.find(m => typeof m.text === 'string' && m.text.startsWith('out of memory here'));
    out.push({title: fig ? String(fig.title.text) : '', yEnd: fig ? fig.y_range.end : null,
              capacity: limits.data.capacity[0], limit: limits.data.limit[0],
              maxReserved: Math.max(...line.data.reserved), maxAllocated: Math.max(...line.data.allocated),
              oomVisible: oom ? oom.visible : null});
  } return out; }"""


def test_controls_lines_and_limits_in_jupyterlab(lab):
    from playwright.sync_api import sync_playwright

    base, token = lab
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1400})
        try:
            run_all_in_lab(page, base, token, "controls.ipynb")
            page.wait_for_function(
                """(sel) => { const p = document.querySelectorAll(sel);
                              return p.length === 5 && Array.from(p).every(x => /\\[\\d+\\]/.test(x.innerText)); }""",
                arg=f"{PANEL} .jp-InputArea-prompt", timeout=240_000)
            prompts = [page.locator(f"{PANEL} .jp-InputArea-prompt").nth(i).inner_text() for i in range(5)]
            n3, n5 = (int(re.search(r"\d+", prompts[i]).group()) for i in (2, 4))
            widget = page.locator(f"{PANEL} .xmem-widget").first
            widget.scroll_into_view_if_needed()
            widget.locator(".xmem-charts canvas").first.wait_for(timeout=60_000)

            # 1. cell numbers: the tensor table, the flame chart's hover, the traceback
            lines = widget.locator("table", has_text="Largest tensors live").inner_text()
            assert f"In[{n3}]:" in lines, lines[:1500]
            tips = page.evaluate(BOKEH_TEXTS_JS)
            assert any(f"In[{n3}]:" in t for t in tips), tips[:5]
            named = {int(k) for t in tips for k in re.findall(r"In\[(\d+)\]:", t)}
            assert named == {n3, n3 + 1}, named  # cells [3] and [4] make tensors; an off-by-one shows [5]
            error = page.locator(f"{PANEL} .jp-Cell").nth(4).locator(".jp-OutputArea-output").last.inner_text()
            assert f"File In[{n5}]:3" in error, error[-1500:]  # the cell's own number and line

            # 4. names, module classes, the caveat
            headline = widget.locator(".xmem-headline-text").first.inner_text()
            selected = widget.locator(".xmem-gpu select").evaluate(
                "s => s.options[s.selectedIndex].text").replace("\xa0", " ")  # ipywidgets: non-breaking spaces
            assert "Tesla T4" in headline and selected.startswith("Tesla T4"), (headline, selected)
            compare = widget.locator("table").first.inner_text()
            assert "Tesla T4" in compare and "NVIDIA H100 80GB HBM3*" in compare, compare
            assert "scaled_dot_product_attention" in widget.inner_text()  # the caveat under the table
            assert "(Linear)" in widget.inner_text()

            # 4. apply the largest batch: the slider takes a value beyond its range
            apply = widget.locator(".xmem-apply-largest")
            apply.wait_for(state="visible", timeout=60_000)
            best = int(re.search(r"\d+", apply.inner_text()).group())
            assert best > 64
            before = widget.locator(".xmem-headline-text").first.inner_text()
            apply.click()
            page.wait_for_function(
                """([sel, n]) => { const r = document.querySelector(sel);
                                   return r && r.textContent.trim() === String(n); }""",
                arg=[f"{PANEL} .xmem-widget .widget-readout", best], timeout=120_000)
            page.wait_for_function(
                """([sel, old]) => { const h = document.querySelector(sel);
                                     return h && h.textContent !== old; }""",
                arg=[f"{PANEL} .xmem-widget .xmem-headline-text", before], timeout=120_000)
            assert widget.locator(".xmem-headline-text").first.inner_text().endswith(")")  # still fits, headroom
            page.screenshot(path=str(ARTIFACTS / "browser_controls.png"))

            # 3. the timelines: capacity and limit on the chart, nothing clipped, the OOM marked
            timelines = page.evaluate(TIMELINES_JS)
            assert len(timelines) >= 2, timelines
            for tl in timelines:
                assert tl["yEnd"] >= max(tl["capacity"], tl["maxReserved"]), tl
                assert tl["limit"] < tl["capacity"]
            assert any(tl["oomVisible"] for tl in timelines), timelines
            oom_widget = page.locator(f"{PANEL} .xmem-widget").nth(1)
            oom_widget.scroll_into_view_if_needed()
            assert "does not fit" in oom_widget.locator(".xmem-headline-text").first.inner_text()
            slider = oom_widget.locator(".xmem-batch-slider")  # found by its name, no flag
            assert "batch_size" in slider.inner_text() and slider.locator(".widget-readout").inner_text().strip() == "16"
            label = oom_widget.locator(".xmem-batch-entry label")  # the whole name shows, not "batch_siz..."
            assert label.evaluate("l => l.scrollWidth <= l.clientWidth") and "batch_size =" in label.inner_text()
            page.screenshot(path=str(ARTIFACTS / "browser_controls_oom.png"))
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "browser_controls_failure.png"), full_page=True)
            raise
        finally:
            browser.close()
