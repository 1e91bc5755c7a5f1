"""Real browser (JupyterLab + Chromium + Playwright): "what would make it fit" as a user meets it.

The user runs a step that does not fit, presses the widget's button, reads the table, picks a
lever in "charts show" and sees its estimate drawn; after a kernel restart the cell's saved
report (the lab extension's renderer) shows the same advice.

Skips without /usr/bin/chromium or Playwright (scripts/setup_browser.sh installs them).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.jupyter_server import CHROMIUM, CHROMIUM_ARGS, jupyter_server, needs_chromium, run_all_in_lab, write_notebook
from tests.jupyter.test_jupyter_advice import DEEP

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"

pytestmark = [pytest.mark.slow, needs_chromium]

# a step that does not fit an 8 GB card (the one tests/jupyter/test_jupyter_advice.py advises on)
CELLS = ["%load_ext xmem_jupyter", "%%xmem --gpu RTX-4060-8GB --batch-var batch" + DEEP]


@pytest.fixture()
def lab(tmp_path):
    pytest.importorskip("playwright.sync_api", reason="playwright (Python package) is not installed")
    nbdir = tmp_path / "nb"
    nbdir.mkdir()
    write_notebook(nbdir / "advice.ipynb", CELLS)
    with jupyter_server(tmp_path / "jupyter", nbdir, pythonpath=ROOT) as server:
        yield server


def test_what_would_make_it_fit_in_jupyterlab(lab):
    from playwright.sync_api import sync_playwright

    base, token = lab
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1400})
        try:
            run_all_in_lab(page, base, token, "advice.ipynb")
            widget = page.locator(f"{PANEL} .xmem-widget").first
            widget.locator(".xmem-charts canvas").first.wait_for(timeout=240_000)
            assert "does not fit" in widget.locator(".xmem-headline-text").first.inner_text()
            assert widget.locator(".xmem-advice").count() == 0  # measured on request only

            widget.locator(".xmem-advise button, button.xmem-advise").first.click()
            panel = widget.locator(".xmem-advice")
            panel.wait_for(timeout=240_000)
            rows = panel.locator("tr.xmem-lever")
            names = [rows.nth(i).locator("td").first.inner_text() for i in range(rows.count())]
            assert {"expandable segments", "activation checkpointing", "gradient accumulation x2",
                    "largest batch that fits"} <= set(names), names
            combination = panel.locator(".xmem-combination").inner_text()
            assert combination and "Cheapest change that fits" in panel.inner_text()
            ckpt = rows.nth(names.index("activation checkpointing")).inner_text()
            assert "fits" in ckpt and "torch.utils.checkpoint.checkpoint" in ckpt, ckpt

            # a lever on the charts: the headline and the timeline are that estimate's
            before = widget.locator(".xmem-headline-text").first.inner_text()
            widget.locator(".xmem-advice-view select").select_option(label="activation checkpointing")
            page.wait_for_function(
                """([sel, old]) => { const h = document.querySelector(sel);
                                     return h && h.textContent !== old && h.textContent.includes('fits'); }""",
                arg=[f"{PANEL} .xmem-widget .xmem-headline-text", before], timeout=60_000)
            assert "does not fit" not in widget.locator(".xmem-headline-text").first.inner_text()
            panel.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "browser_advice.png"))

            # the kernel restarts: the saved report shows the same advice (labextension/src/advice.ts)
            page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()")
            report = page.locator(f"{PANEL} .jp-RenderedXmemReport .xmem-advice").first
            report.wait_for(timeout=60_000)
            assert report.locator(".xmem-combination").inner_text() == combination
            saved = report.locator("tr.xmem-lever")
            assert saved.count() == len(names)
            # the report stayed the cell's: the step as written, not the lever viewed last
            headline = page.locator(f"{PANEL} .jp-RenderedXmemReport .xmem-headline-text").first.inner_text()
            assert "does not fit" in headline, headline
            report.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "browser_advice_saved.png"))
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "browser_advice_failure.png"), full_page=True)
            raise
        finally:
            browser.close()
