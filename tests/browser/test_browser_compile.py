"""Real browser (JupyterLab + Chromium + Playwright): the widget's torch.compile toggle (issue
#32 item 4) on a cell that compiles, in the fine-tuning stack's kernel ("Python (xmem
fine-tuning stack)": PyPI's CUDA wheel with Triton, where Inductor can compile for the GPU).

The kernel is installed by `make finetune-setup` (`make test-finetune` runs this file after
setting it up); without it, or without Chromium, this skips.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jupyter_server import CHROMIUM, CHROMIUM_ARGS, jupyter_server, needs_chromium, run_all_in_lab, write_notebook
from tests.jupyter.test_compile_toggle import COMPILED_STEP

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"
KERNEL = ("xmem-finetune", "Python (xmem fine-tuning stack)")


def _kernel_installed() -> bool:
    out = subprocess.run([sys.executable, "-m", "jupyter", "kernelspec", "list", "--json"], capture_output=True,
                         text=True)
    return out.returncode == 0 and KERNEL[0] in json.loads(out.stdout).get("kernelspecs", {})


pytestmark = [pytest.mark.slow, needs_chromium,
              pytest.mark.skipif(not _kernel_installed(), reason="the xmem-finetune kernel is not installed "
                                                                  "(make finetune-setup)")]

CELLS = [
    "%load_ext xmem_jupyter",
    "%%xmem --gpu H100-SXM-80GB\n" + COMPILED_STEP.rstrip("\n"),
]


@pytest.fixture()
def lab(tmp_path):
    pytest.importorskip("playwright.sync_api", reason="playwright (Python package) is not installed")
    nbdir = tmp_path / "nb"
    nbdir.mkdir()
    write_notebook(nbdir / "compile.ipynb", CELLS, kernel=KERNEL)
    with jupyter_server(tmp_path / "jupyter", nbdir, pythonpath=ROOT) as server:
        yield server


def test_the_compile_toggle_shows_the_eager_step_and_what_compiling_saves(lab):
    from playwright.sync_api import sync_playwright

    base, token = lab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1400})
        try:
            run_all_in_lab(page, base, token, "compile.ipynb", timeout_ms=180_000)
            widget = page.locator(f"{PANEL} .xmem-widget").first
            widget.wait_for(timeout=300_000)
            headline = widget.locator(".xmem-headline-text").first
            compiled = headline.inner_text()
            assert "compiled for the target GPU by Inductor" in widget.inner_text()
            toggle = widget.locator(".xmem-compile button, button.xmem-compile").first
            toggle.wait_for(state="visible", timeout=30_000)
            assert toggle.inner_text().strip() == "torch.compile on"
            toggle.click()
            page.wait_for_function("([sel, old]) => { const h = document.querySelector(sel);"
                                   " return h && h.textContent !== old; }",
                                   arg=[f"{PANEL} .xmem-widget .xmem-headline-text", compiled], timeout=300_000)
            note = widget.locator(".xmem-compile-note")
            note.wait_for(timeout=60_000)
            text = note.inner_text().replace("\xa0", " ")
            assert toggle.inner_text().strip() == "torch.compile off"
            m = re.search(r"torch\.compile saves (\S+ \S+) \(peak (\S+ GiB) compiled, (\S+ GiB) eager\)", text)
            assert m, text
            assert m.group(2) in compiled and m.group(3) in widget.locator(".xmem-headline-text").first.inner_text()
            assert "ran eagerly (asked: --compile eager)" in widget.inner_text()
            page.screenshot(path=str(ARTIFACTS / "browser_compile.png"))
        except Exception:
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "browser_compile_failure.png"), full_page=True)
            raise
        finally:
            browser.close()
