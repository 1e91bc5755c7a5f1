"""A real browser on the quickstart: JupyterLab on 127.0.0.1, Debian Chromium driven by Playwright.

It runs the notebook, checks that the headline and the flame chart's canvas render, switches
the first widget's GPU and sees the headline change, and saves a screenshot under
``artifacts/``. Chromium comes from ``scripts/setup_browser.sh`` (apt); without it the test
skips and says why.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.jupyter_server import CHROMIUM, CHROMIUM_ARGS, jupyter_server, needs_chromium, run_all_in_lab

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
NOTEBOOK = ROOT / "demo_notebooks" / "01_quickstart.ipynb"
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"

pytestmark = [
    pytest.mark.slow,
    needs_chromium,
]


@pytest.fixture()
def lab(tmp_path):
    """JupyterLab in private Jupyter dirs, serving a copy of the quickstart."""
    pytest.importorskip("playwright.sync_api", reason="playwright (Python package) is not installed")
    nbdir = tmp_path / "nb"
    nbdir.mkdir()
    shutil.copy(NOTEBOOK, nbdir / NOTEBOOK.name)
    with jupyter_server(tmp_path / "jupyter", nbdir, pythonpath=ROOT) as server:
        yield server


def _gpu_label(key: str) -> str:
    from xmem_engine.gpus import load_catalog
    from xmem_jupyter.figures import amount

    g = load_catalog()[key]
    return f"{g.name} ({amount(g.total_memory_bytes)})"


# true when a Bokeh document in the page has a title, label or legend item containing the given
# text (drawn on the canvas, so they are looked up in BokehJS's models, not in the DOM)
TITLE_JS = """(text) => (window.Bokeh && window.Bokeh.documents || []).some(d => {
    for (const m of d.all_models) {
      const l = m.label, t = typeof m.text === 'string' ? m.text : typeof l === 'string' ? l : (l && l.value);
      if (typeof t === 'string' && t.includes(text)) return true; }
    return false; })"""


def _each_result_showing(page, widget: bool, timeout: float) -> bool:
    """Wait until every xmem result shows its live widget (or none does); False on timeout."""
    try:
        page.wait_for_function(
            """([sel, widget]) => Array.from(document.querySelectorAll(sel)).every(r =>
                   (r.querySelectorAll('.xmem-widget').length === (widget ? 1 : 0)))""",
            arg=[f"{PANEL} .jp-RenderedXmemResult", widget], timeout=timeout)
        return True
    except Exception:  # noqa: BLE001 - playwright's TimeoutError; the caller checks what shows
        return False


def _one_result_per_cell(page, showing: str) -> None:
    """Each %%xmem cell has one output, showing either the live widget or the saved report,
    never both, never a widget error or a widget's repr."""
    results = page.locator(f"{PANEL} .jp-RenderedXmemResult")
    n = results.count()
    sources = page.evaluate("""() => { const cells = window.jupyterapp.shell.currentWidget.content.model.cells;
        const out = []; for (let i = 0; i < cells.length; i++) { out.push(cells.get(i).sharedModel.getSource()); }
        return out; }""")
    xmem_cells = [s for s in sources if s.startswith("%%xmem") and "--quiet" not in s.split("\n")[0]]
    assert n == len(xmem_cells) > 0, (n, len(xmem_cells))
    # the report stands in while a widget (re-)renders: on a loaded machine that takes seconds
    _each_result_showing(page, showing == "widget", timeout=60_000)
    for i in range(n):
        r = results.nth(i)
        report_visible = r.locator(":scope > .jp-RenderedXmemReport").evaluate(
            "e => !e.classList.contains('lm-mod-hidden')")
        widgets = r.locator(".xmem-widget").count()
        if showing == "widget":
            assert widgets == 1 and not report_visible, (i, widgets, report_visible)
        else:
            assert widgets == 0 and report_visible, (i, widgets, report_visible)
    text = page.locator(PANEL).inner_text()
    assert "Error displaying widget" not in text and "XmemWidget(" not in text


def test_quickstart_in_jupyterlab(lab):
    from playwright.sync_api import sync_playwright

    base, token = lab
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        console: list[str] = []
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"[:500]))
        try:
            run_all_in_lab(page, base, token, NOTEBOOK.name)

            # JupyterLab 4 skips rendering cells outside the viewport (content-visibility), and
            # Bokeh draws only what is laid out: bring a widget into view before looking at it
            headline = page.locator(f"{PANEL} .xmem-widget .xmem-headline").first
            headline.wait_for(state="attached", timeout=150_000)
            first_widget = page.locator(f"{PANEL} .xmem-widget").first
            first_widget.scroll_into_view_if_needed()
            canvas = first_widget.locator(".xmem-charts canvas").first
            canvas.wait_for(timeout=60_000)
            box = canvas.bounding_box()
            assert box and box["width"] > 200 and box["height"] > 100, box
            before = headline.text_content()
            assert "T4" in before, before

            # the dropdown re-simulates on the kernel; the headline follows
            first_widget.locator(".xmem-gpu select").select_option(label=_gpu_label("H100-SXM-80GB"))
            page.wait_for_function(
                """(sel) => { const h = document.querySelector(sel);
                              return h && h.textContent.includes('H100'); }""",
                arg=f"{PANEL} .xmem-widget .xmem-headline", timeout=30_000)
            after = headline.text_content()
            assert after != before and "H100" in after
            # the charts followed (a Bokeh patch): the timeline's legend names the H100's capacity
            page.wait_for_function(TITLE_JS, arg="GPU capacity 79.18 GiB", timeout=30_000)
            # the whole notebook ran: the transformer's widget is there too
            second = page.locator(f"{PANEL} .xmem-widget").nth(1)
            second.wait_for(state="attached", timeout=150_000)
            second.scroll_into_view_if_needed()
            second.locator(".xmem-charts canvas").first.wait_for(timeout=60_000)
            page.wait_for_function(
                """(sel) => { const c = document.querySelectorAll(sel); return c.length > 0 &&
                              Array.from(c).every(x => !x.innerText.includes('[*]')); }""",
                arg=f"{PANEL} .jp-InputArea-prompt", timeout=150_000)
            first_widget.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "browser_quickstart.png"), full_page=False)
            page.set_viewport_size({"width": 1400, "height": 2200})
            first_widget.screenshot(path=str(ARTIFACTS / "browser_quickstart_widget.png"))

            _one_result_per_cell(page, showing="widget")

            # save, reload the page against the same kernel: the widgets come back from the
            # kernel and BokehJS is found again (the shared loader widget re-runs it)
            page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
            page.wait_for_function("() => !document.title.startsWith('*') && "
                                   "!document.querySelector('.jp-mod-dirty')", timeout=30_000)
            again = page.locator(f"{PANEL} .xmem-widget").first
            for attempt in range(3):
                page.reload()
                # ipywidgets' manager gives a widget output 2 s to find its model while it
                # restores all models from the kernel; on a loaded machine a widget can lose the
                # race ("model not found", an upstream JupyterLab/ipywidgets matter, not
                # BokehJS; its cell shows the saved report): reload again until every one is back
                page.locator(f"{PANEL} .xmem-widget, {PANEL} .jupyter-widgets:has-text('model not found')"
                             ).first.wait_for(state="attached", timeout=90_000)
                if _each_result_showing(page, True, timeout=30_000):
                    break
            again.wait_for(state="attached", timeout=90_000)
            again.scroll_into_view_if_needed()
            again.locator(".xmem-charts canvas").first.wait_for(timeout=60_000)
            assert "H100" in again.locator(".xmem-headline").first.text_content()
            page.wait_for_function(TITLE_JS, arg="GPU capacity 79.18 GiB", timeout=30_000)
            again.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "browser_quickstart_after_reload.png"))
            _one_result_per_cell(page, showing="widget")

            # the kernel restarts: its widgets are gone, each output shows its saved report
            page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()")
            page.wait_for_function(
                """(sel) => { const r = document.querySelectorAll(sel + ' .jp-RenderedXmemResult');
                              return r.length > 0 && Array.from(r).every(x => !x.querySelector('.xmem-widget')); }""",
                arg=PANEL, timeout=60_000)
            _one_result_per_cell(page, showing="report")
            # the saved report followed the widget: the GPU chosen last, not the cell's first
            saved = page.locator(f"{PANEL} .jp-RenderedXmemReport .xmem-headline-text").first.inner_text()
            assert "H100" in saved, saved
            page.locator(f"{PANEL} .jp-RenderedXmemResult").first.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "browser_quickstart_after_restart.png"))
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "browser_failure.png"), full_page=True)
            (ARTIFACTS / "browser_failure_console.txt").write_text("\n".join(console + errors))
            raise
        finally:
            browser.close()
    assert not [e for e in errors if "Bokeh" in e], errors
