"""How long the widget's batch slider takes per move, in a real browser (JupyterLab + Chromium).

    .venv/bin/python benchmarks/slider_speed.py [--moves 10]

The quickstart's small CNN, with ``--batch-var batch --batch-values 16:128:8`` (batch 64 in the
cell). The slider's handle is dragged to a batch size, as a user does. Three times per move:
from the drag to the headline's new text as Playwright sees it (its own round trips
included), and, measured in the page from the pointer's release, until the headline shows
the new figures and until the flame chart's data (BokehJS) is the new one. The first move
traces the step once with the batch size as a symbol (``xmem_engine/tracing/symbolic.py``);
every move after it is that trace at the new size (``batch_family.SymbolicFamily``): no code
run, a simulation per GPU shown. Prints each
move, then the medians of the moves after the first. Needs Chromium and Playwright
(``scripts/setup_browser.sh``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from jupyter_server import CHROMIUM, CHROMIUM_ARGS, jupyter_server, run_all_in_lab, write_notebook  # noqa: E402

PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"
CELLS = [
    "%load_ext xmem_jupyter",
    '''import torch, torch.nn as nn, torch.nn.functional as F


def conv_block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.MaxPool2d(2))


class SmallCNN(nn.Module):
    def __init__(self, classes=100):
        super().__init__()
        self.features = nn.Sequential(conv_block(3, 32), conv_block(32, 64), conv_block(64, 128),
                                      conv_block(128, 256))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, classes))

    def forward(self, x):
        return self.head(self.features(x))''',
    '''%%xmem --gpu T4 --gpu A100-SXM4-40GB --batch-var batch --batch-values 16:128:8
batch = 64
model = SmallCNN().cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
images = torch.randn(batch, 3, 224, 224, device="cuda")
labels = torch.randint(0, 100, (batch,), device="cuda")
F.cross_entropy(model(images), labels).backward()
opt.step()
opt.zero_grad(set_to_none=True)''',
]
VALUES = list(range(16, 129, 8))
MOVES = [72, 80, 96, 120, 128, 40, 16, 24, 104, 56]  # the slider's handle dragged to each
# in the page, from the pointer's release: when the headline shows new text, and when the flame
# chart's data (BokehJS) is new, checked every animation frame
WATCH_JS = """([headline, slider]) => {
  const flame = () => { for (const d of (window.Bokeh && window.Bokeh.documents) || [])
                          for (const m of d.all_models) if (m.data && m.data.tip) return m.data;
                        return null; };
  document.querySelector(slider).addEventListener('pointerup', () => {
    const m = window.__xmemMarks = {up: performance.now()};
    const text = document.querySelector(headline).textContent, data = flame();
    const tick = () => {
      const now = performance.now() - m.up;
      if (m.headline === undefined && document.querySelector(headline).textContent !== text) m.headline = now;
      if (m.charts === undefined && flame() !== data) m.charts = now;
      if ((m.headline === undefined || m.charts === undefined) && now < 60000) requestAnimationFrame(tick);
    };
    requestAnimationFrame(tick);
  }, true);
}"""
HEADLINE = f"{PANEL} .xmem-widget .xmem-headline-text"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--moves", type=int, default=len(MOVES))
    args = ap.parse_args()
    if not CHROMIUM.exists():
        sys.exit(f"no {CHROMIUM}: scripts/setup_browser.sh installs it")
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        nbdir = Path(tmp) / "nb"
        nbdir.mkdir()
        write_notebook(nbdir / "slider.ipynb", CELLS)
        with jupyter_server(Path(tmp) / "jupyter", nbdir, pythonpath=ROOT) as (base, token), sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 1400})
            run_all_in_lab(page, base, token, "slider.ipynb")
            page.locator(f"{PANEL} .xmem-widget .xmem-charts canvas").first.wait_for(timeout=300_000)
            track = page.locator(f"{PANEL} .xmem-widget .xmem-batch-slider .noUi-target").first
            track.scroll_into_view_if_needed()
            readout = page.locator(f"{PANEL} .xmem-widget .widget-readout").first
            box = track.bounding_box()
            handle = track.locator(".noUi-handle").first
            stops = len(VALUES) - 1
            times, shown, charts = [], [], []
            page.evaluate(WATCH_JS, [HEADLINE, f"{PANEL} .xmem-widget .xmem-batch-slider"])
            for i, value in enumerate(MOVES[:args.moves]):
                before = page.locator(HEADLINE).first.text_content()
                t0 = time.perf_counter()
                hb = handle.bounding_box()
                page.mouse.move(hb["x"] + hb["width"] / 2, hb["y"] + hb["height"] / 2)
                page.mouse.down()
                page.mouse.move(box["x"] + box["width"] * VALUES.index(value) / stops, hb["y"] + hb["height"] / 2)
                page.mouse.up()
                page.wait_for_function("([sel, old]) => { const h = document.querySelector(sel);"
                                       " return h && h.textContent !== old; }", arg=[HEADLINE, before],
                                       timeout=120_000)
                ms = (time.perf_counter() - t0) * 1e3
                page.wait_for_function("() => window.__xmemMarks && window.__xmemMarks.charts !== undefined",
                                       timeout=120_000)
                marks = page.evaluate("() => window.__xmemMarks")
                shown.append(marks["headline"])
                charts.append(marks["charts"])
                times.append(ms)
                print(f"move {i + 1}: batch {readout.text_content().strip():>4}  {ms:8.1f} ms to the new headline "
                      f"(Playwright), in the page {marks['headline']:6.1f} ms to the headline, "
                      f"{marks['charts']:6.1f} ms to the charts' data"
                      f"{'  (traced: the batch as a symbol)' if i == 0 else ''}", flush=True)
            browser.close()
    for name, ms in (("headline (Playwright: drag to new text)", times), ("headline (in the page)", shown),
                     ("charts' data (in the page)", charts)):
        later = ms[1:]
        print(f"{name}: median per move after the first {statistics.median(later):.1f} ms, "
              f"max {max(later):.1f} ms; the first (traced) {ms[0]:.1f} ms")


if __name__ == "__main__":
    main()
