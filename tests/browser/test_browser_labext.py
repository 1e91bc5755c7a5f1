"""Real browser: a saved notebook with xmem report outputs, opened in JupyterLab with no
kernel at all, shows the estimate (headline + chart) through the lab extension, in the light
and dark themes; markup in the data stays text. Notebook 7 too, where it is installed.

Needs Debian's chromium (scripts/setup_browser.sh) and Playwright (Python); skips without.
Screenshots go to artifacts/ (labext-light.png, labext-dark.png, labext-notebook7.png).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import sys
from pathlib import Path

import pytest

from tests.jupyter_server import CHROMIUM, CHROMIUM_ARGS, get_json, jupyter_server, needs_chromium

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "xmem_engine" / "data" / "report-examples"
ARTIFACTS = REPO / "artifacts"
MIME = "application/vnd.xmem.report+json"
LABEXT = Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "xmem-jupyter" / "package.json"

pytestmark = [
    pytest.mark.slow,
    needs_chromium,
    pytest.mark.skipif(not LABEXT.is_file(),
                       reason="the xmem lab extension is not installed here (pip install -e .)"),
]

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (Python) is not installed")


def gib(b: int) -> str:
    return f"{b / 2**30:.2f} GiB"


def headline(r: dict) -> str:
    head = f"Peak {gib(r['peak_device_bytes'])} of {gib(r['capacity_bytes'])} on {r['gpu_name']}"
    if r["fits"]:
        return f"{head} — fits (headroom {gib(r['headroom_bytes'])})"
    return f"{head} — does not fit (short by {gib(-r['headroom_bytes'])})"


def example(name: str) -> dict:
    return json.loads((EXAMPLES / name).read_text())


def report_output(report: dict) -> dict:
    return {"output_type": "display_data", "metadata": {},
            "data": {MIME: report,
                     # the magic's HTML summary for renderers without the extension (GitHub...)
                     "text/html": ["<div class='xmem-html-fallback'>xmem HTML summary</div>"],
                     "text/plain": ["<xmem estimate: open in JupyterLab or Notebook 7 to see it>"]}}


def live_output(report: dict) -> dict:
    """What %%xmem leaves in a saved notebook: one output holding the widget's view (dead
    without its kernel) and the static report."""
    out = report_output(report)
    out["data"]["application/vnd.jupyter.widget-view+json"] = {
        "model_id": "0123456789abcdef0123456789abcdef", "version_major": 2, "version_minor": 0}
    return out


def write_notebook(path: Path) -> None:
    cells = []
    for i, (src, outputs) in enumerate([
        ("%%xmem --gpu RTX-4060-8GB\n# the small MLP", [live_output(example("mlp-rtx4060.json"))]),
        ("%%xmem --gpu RTX-4060-8GB\n# the large MLP", [report_output(example("mlp-large-rtx4060-does-not-fit.json"))]),
        ("%%xmem\n# names with markup", [report_output(example("markup-in-names.json"))]),
        ("%%xmem\n# a report from a future xmem", [report_output(example("unknown-version-99.json"))]),
    ]):
        cells.append({"cell_type": "code", "id": f"cell-{i}", "metadata": {}, "execution_count": i + 1,
                      "source": src, "outputs": outputs})
    nb = {"nbformat": 4, "nbformat_minor": 5, "cells": cells,
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                       "language_info": {"name": "python"}}}
    path.write_text(json.dumps(nb, indent=1))


@pytest.fixture
def notebook_dir(tmp_path):
    (tmp_path / "nb").mkdir()
    write_notebook(tmp_path / "nb" / "estimate.ipynb")
    ARTIFACTS.mkdir(exist_ok=True)
    return tmp_path


@contextlib.contextmanager
def browser_page():
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1600})
            dialogs: list[str] = []
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            yield page, dialogs, errors
        finally:
            browser.close()


def dismiss_kernel_dialog(page, timeout_ms: int = 10000) -> None:
    """With no kernel spec, the front end asks which kernel to use: choose none."""
    with contextlib.suppress(Exception):
        dialog = page.locator(".jp-Dialog")
        dialog.wait_for(state="visible", timeout=timeout_ms)
        for label in ("No Kernel", "Cancel"):
            button = dialog.get_by_role("button", name=label)
            if button.count():
                button.first.click()
                break
        else:
            page.keyboard.press("Escape")
        dialog.wait_for(state="detached", timeout=5000)


def check_reports(page, scope: str) -> list:
    outputs = page.locator(f"{scope} .jp-RenderedXmemReport")
    outputs.nth(3).wait_for(state="attached", timeout=60000)
    assert outputs.count() == 4
    # the extension's renderer wins over the HTML fallback of the same output
    assert page.locator(f"{scope} .xmem-html-fallback").count() == 0

    fits, nofit, markup, future = (outputs.nth(i) for i in range(4))
    assert fits.locator(".xmem-headline-text").inner_text() == headline(example("mlp-rtx4060.json"))
    assert nofit.locator(".xmem-headline-text").inner_text() == headline(example("mlp-large-rtx4060-does-not-fit.json"))
    assert nofit.locator(".xmem-headline-text").inner_text().endswith("does not fit (short by 2.88 GiB)")
    for out in (fits, nofit, markup):
        chart = out.locator("svg.xmem-chart")
        assert chart.count() == 1
        box = chart.bounding_box()
        assert box and box["width"] > 300 and box["height"] > 80, box
        assert chart.locator("polyline.xmem-line-allocated").count() == 1
        assert chart.locator("polyline.xmem-line-reserved").count() == 1
        # two peaks, each named: the allocated peak and the reserved peak
        assert chart.locator("circle.xmem-peak-dot").count() == 2
        labels = [t.strip() for t in chart.locator(".xmem-peak-label").all_text_contents()]
        assert [x.split(" ")[0] for x in labels] == ["allocated", "reserved"], labels
        points = chart.locator("polyline.xmem-line-allocated").get_attribute("points")
        assert len(points.split()) > 20
    assert nofit.locator("svg.xmem-chart .xmem-line-capacity").count() == 1

    # one result per output, and nothing of the dead widget: no error, no repr
    text = page.locator(scope).inner_text()
    assert "Error displaying widget" not in text and "Loading widget" not in text, text[:2000]
    assert "VBox(" not in text and "XmemWidget(" not in text

    # markup stays text
    assert markup.locator("img, script, iframe, a, style, b").count() == 0
    assert "<img src=x onerror=alert(1)>" in markup.inner_text()
    # an unknown version: a clear message, not a blank
    assert "format version 99" in future.inner_text()
    assert future.locator("svg").count() == 0
    return [fits, nofit, markup, future]


def test_saved_reports_render_without_a_kernel_in_jupyterlab(notebook_dir):
    with jupyter_server(notebook_dir, notebook_dir / "nb", "jupyterlab", kernels=False) as (base, token), \
            browser_page() as (page, dialogs, errors):
        workspace = f"xmem-test-{secrets.token_hex(4)}"
        page.goto(f"{base}/lab/workspaces/{workspace}/tree/estimate.ipynb?reset&token={token}")
        scope = ".jp-NotebookPanel:not(.lm-mod-hidden)"
        fits, nofit, markup, future = check_reports(page, scope)
        dismiss_kernel_dialog(page)

        # an unsigned notebook is untrusted: the renderer (safe: true) must still run
        trusted = page.evaluate("() => window.jupyterapp.shell.currentWidget.content.model.cells.get(0).trusted")
        assert trusted is False
        # the widget output beside it is dead (no kernel); the report does not depend on it
        assert get_json(f"{base}/api/kernels?token={token}") == []

        fits.scroll_into_view_if_needed()
        page.wait_for_timeout(300)
        # hovering the chart reads out the memory at that event
        box = fits.locator("svg.xmem-chart").bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.55, box["y"] + box["height"] * 0.5)
        readout = fits.locator(".xmem-readout")
        assert readout.text_content().startswith("event "), readout.text_content()
        assert "allocated" in readout.text_content() and "reserved" in readout.text_content()
        page.screenshot(path=str(ARTIFACTS / "labext-light.png"), full_page=False)
        markup.locator("details.xmem-tensors > summary").click()
        assert markup.locator(".xmem-tensors tbody tr").first.is_visible()
        assert "<svg onload=alert(4)>" in markup.locator(".xmem-tensors tbody").inner_text()
        markup.screenshot(path=str(ARTIFACTS / "labext-markup.png"))
        light = fits.locator(".xmem-report").evaluate("e => getComputedStyle(e).backgroundColor")
        light_text = fits.locator(".xmem-split").evaluate("e => getComputedStyle(e).color")

        page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
        page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'", timeout=30000)
        page.wait_for_timeout(500)
        dark = fits.locator(".xmem-report").evaluate("e => getComputedStyle(e).backgroundColor")
        dark_text = fits.locator(".xmem-split").evaluate("e => getComputedStyle(e).color")
        page.screenshot(path=str(ARTIFACTS / "labext-dark.png"), full_page=False)
        assert light != dark and light_text != dark_text, (light, dark, light_text, dark_text)

        assert dialogs == [], f"the page opened dialogs (script ran from the data?): {dialogs}"
        assert get_json(f"{base}/api/kernels?token={token}") == []
        assert not [e for e in errors if "xmem" in e.lower()], errors


def test_saved_reports_render_without_a_kernel_in_notebook7(notebook_dir):
    pytest.importorskip("notebook", reason="Notebook 7 (the `notebook` package) is not installed")
    import notebook
    if int(notebook.__version__.split(".")[0]) < 7:
        pytest.skip(f"notebook {notebook.__version__} is not Notebook 7")
    with jupyter_server(notebook_dir, notebook_dir / "nb", "notebook", kernels=False) as (base, token), \
            browser_page() as (page, dialogs, errors):
        page.goto(f"{base}/notebooks/estimate.ipynb?token={token}")
        fits, *_ = check_reports(page, ".jp-NotebookPanel")
        dismiss_kernel_dialog(page)
        fits.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "labext-notebook7.png"), full_page=False)
        assert dialogs == []
        assert get_json(f"{base}/api/kernels?token={token}") == []


def test_a_trusted_saved_notebook_shows_the_report_not_the_dead_widget(notebook_dir):
    """Trusted (signed, as JupyterLab signs what it saves), no kernel: ipywidgets' renderer
    would take the output and say "model not found"; the extension shows the report."""
    import nbformat
    from nbformat.sign import NotebookNotary

    path = notebook_dir / "nb" / "estimate.ipynb"
    nb = nbformat.read(path, as_version=4)
    (notebook_dir / "data").mkdir(exist_ok=True)
    NotebookNotary(data_dir=str(notebook_dir / "data")).sign(nb)
    nbformat.write(nb, path)
    with jupyter_server(notebook_dir, notebook_dir / "nb", "jupyterlab", kernels=False) as (base, token), \
            browser_page() as (page, dialogs, errors):
        page.goto(f"{base}/lab/workspaces/xmem-test-{secrets.token_hex(4)}/tree/estimate.ipynb?reset&token={token}")
        scope = ".jp-NotebookPanel:not(.lm-mod-hidden)"
        check_reports(page, scope)
        dismiss_kernel_dialog(page)
        trusted = page.evaluate("() => window.jupyterapp.shell.currentWidget.content.model.cells.get(0).trusted")
        assert trusted is True
        page.wait_for_timeout(3000)  # ipywidgets' manager gives up on the model meanwhile
        first = page.locator(f"{scope} .jp-RenderedXmemResult").first
        assert first.locator(".jp-RenderedXmemReport").is_visible()
        assert first.locator(".xmem-headline-text").inner_text() == headline(example("mlp-rtx4060.json"))
        text = page.locator(scope).inner_text()
        assert "Error displaying widget" not in text and "Loading widget" not in text
        page.screenshot(path=str(ARTIFACTS / "labext-trusted-no-kernel.png"), full_page=False)
