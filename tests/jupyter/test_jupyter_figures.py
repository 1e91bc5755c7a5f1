"""One set of numbers (issue #35 item 4) and legible colours (item 5), from Python.

Every view of one estimate (the widget's text and bar tooltips, its charts' labels and
legends, the static HTML, the saved report) shows each named quantity with one number; the
themed colours meet 4.5:1 on their theme's backgrounds; the lab extension's copy of them is
current; the widget's controls are described and the batch entry validates what it is given.
"""

from __future__ import annotations

import re
import time
from html import unescape
from pathlib import Path

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("jupyter_bokeh")

from xmem_engine.estimate import REPORT_MIME, estimate  # noqa: E402
from xmem_jupyter.figures import amount, figures, split_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20

# Two 600 MiB tensors (the allocated peak), both freed, then a 700 MiB one that no cached
# block can hold: the allocator reserves a new segment after the allocated peak. Reserved when allocated peaked
# minus allocated is 0 here; the reserved peak minus the allocated peak is 700 MiB: the two
# quantities the widget text and the bar's tooltip once both called "cached but unused".
FRAGMENTED = f"""
import torch
a = torch.empty({600 * MiB}, dtype=torch.uint8, device="cuda")
b = torch.empty({600 * MiB}, dtype=torch.uint8, device="cuda")
del a, b
c = torch.empty({700 * MiB}, dtype=torch.uint8, device="cuda")
"""


@pytest.fixture(scope="module")
def est():
    return estimate(FRAGMENTED, "T4", namespace={}, mode="fake")


def _named_amounts(text: str, names: list[str]) -> dict[str, set[str]]:
    """Each name -> the amounts printed right after it ("allocated peak 1.17 GiB")."""
    text = unescape(re.sub(r"<[^>]+>", " ", text)).replace("\xa0", " ")
    out: dict[str, set[str]] = {}
    # longest names first, so "reserved peak" is not read inside another name
    for name in sorted(names, key=len, reverse=True):
        for m in re.finditer(rf"(?<![\w-]){re.escape(name)}:? (-?\d+\.\d\d [KMGT]?i?B)", text):
            out.setdefault(name, set()).add(m.group(1))
        text = re.sub(rf"(?<![\w-]){re.escape(name)}", " ", text)
    return out


def test_the_case_has_two_different_reserved_figures(est):
    """The estimate this file tests on: reserved grows after the allocated peak."""
    assert est.reserved_at_peak_bytes - est.peak_allocated_bytes < 16 * MiB
    assert est.peak_reserved_bytes - est.peak_allocated_bytes >= 690 * MiB


def test_every_view_shows_each_figure_with_one_number(est):
    """Widget text, bar tooltips, chart labels and legends, chart summary, static HTML and the
    saved report, read off one estimate: a figure's name is always followed by its amount."""
    from xmem_jupyter.report import report_bundle
    from xmem_jupyter.widget import XmemWidget

    figs = figures(est)
    names = [f.name for f in figs.values()]
    w = XmemWidget(est)
    bundle = report_bundle(est, widget=w)
    report = bundle[REPORT_MIME]
    views = {
        "widget text": w.headline.value,
        "bar tooltips": " ".join(re.findall(r"title='([^']*)'", w.headline.value)),
        "chart labels": " ".join([w.charts.peak_label.text, w.charts.oom_label.text]
                                 + [i.label["value"] for i in w.charts.legend_items.values()]),
        "chart summary": w.chart_summary.value,
        "static html": bundle["text/html"],
        "saved report": report["figures"]["text"] + " " + " ".join(
            f"{v['name']} {amount(v['bytes'])}" for v in report["figures"]["items"].values()),
        "cli summary": est.summary(),
        "headline detail": report["headline_detail"],
    }
    seen: dict[str, dict[str, set[str]]] = {v: _named_amounts(t, names) for v, t in views.items()}
    for key, f in figs.items():
        shown = {view: found[f.name] for view, found in seen.items() if f.name in found}
        assert all(v == {amount(f.bytes)} for v in shown.values()), (f.name, shown)
    # each view names the figures it is for
    assert {"allocated peak", "reserved peak", "reserved above the allocated peak"} <= set(seen["widget text"])
    assert {"allocated peak", "reserved above the allocated peak"} <= set(seen["bar tooltips"])
    assert {"allocated peak", "reserved peak", "GPU capacity", "allocator limit"} <= set(seen["chart labels"])
    # the bar's parts add up to the headline's peak, and the split says so in words
    parts = [report["figures"]["items"][k]["bytes"] for k in report["figures"]["split"]]
    assert sum(parts) == est.peak_device_bytes
    assert split_text(est) == report["figures"]["text"]
    assert f"Peak {amount(est.peak_device_bytes)}" in est.headline  # the headline's unit is the figures' unit
    # the retired name is gone: one quantity, one name
    assert "cached but unused" not in " ".join(views.values())
    # the CLI's line under the headline says which peak is which (issue #35 item 4): the reserved
    # peak, the tensors at that moment, and the allocated peak, at another moment here
    assert {"CUDA context", "libraries", "reserved peak", "allocated at the reserved peak",
            "allocated peak"} <= set(seen["headline detail"])
    assert seen["headline detail"]["allocated at the reserved peak"] != seen["headline detail"]["allocated peak"]
    # the total - free reading beside the nvidia-smi one, in the widget and the static HTML
    assert {"total - free", "driver reserve", "peak device memory"} <= set(seen["widget text"])
    assert {"total - free", "driver reserve"} <= set(seen["static html"])


# A loop of two steps whose second step peaks higher: its forward runs on the optimizer's state
LOOP = """
import torch, torch.nn as nn
model = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(4)]).cuda()
opt = torch.optim.AdamW(model.parameters())
for _ in range(2):
    x = torch.randn(16384, 2048, device="cuda")
    model(x).sum().backward()
    opt.step(); opt.zero_grad()
"""


def test_the_first_steps_peak_is_shown_beside_the_steady_state_in_every_view():
    """Issue #35 item 2: where the first step peaks >= 1% lower, the headline stays the steady
    state's and one line gives both, with the same numbers in the widget, the static HTML, the
    saved report, the CLI summary and the charts' text; a single step shows no such line."""
    from xmem_jupyter.figures import STEADY_WHY, figures, steady_text
    from xmem_jupyter.report import report_bundle
    from xmem_jupyter.widget import XmemWidget

    loop = estimate(LOOP, "T4", namespace={}, mode="fake")
    first = loop.first_step_peak_device_bytes
    assert loop.steps == 2 and first is not None and loop.peak_device_bytes - first > 0.05 * loop.peak_device_bytes
    line = steady_text(loop)
    assert line == (f"first-step peak {amount(first)}; peak device memory {amount(loop.peak_device_bytes)} over 2 "
                    f"steps, the steady state: {STEADY_WHY}")
    w = XmemWidget(loop)
    bundle = report_bundle(loop, widget=w)
    assert line in unescape(w.headline.value) and line in unescape(bundle["text/html"])
    assert f"  {line}" in loop.summary().splitlines()
    assert loop.headline.startswith(f"Peak {amount(loop.peak_device_bytes)}")  # the headline: the steady state
    items = bundle[REPORT_MIME]["figures"]["items"]
    assert items["first_step_peak"]["bytes"] == first == bundle[REPORT_MIME]["first_step_peak_device_bytes"]
    # the timeline labels where the first step ends
    step2 = loop.timeline.iterations[1]
    assert w.charts.step_label is not None and w.charts.step_label.x == step2
    assert w.charts.step_label.text == "step 2 of 2 starts"
    assert f"step 2 of 2 starts at event {step2:,}" in w.chart_summary.value
    # one step (the file's other case): no first-step line anywhere
    single = estimate(FRAGMENTED, "T4", namespace={}, mode="fake")
    assert steady_text(single) is None and "first_step_peak" not in figures(single)
    assert "first-step peak" not in single.summary() and "first-step peak" not in XmemWidget(single).headline.value


def test_fixed_memory_parts_say_which_are_measured_and_where_the_rest_come_from(est):
    """Issue #37: the fixed memory's parts, folded under the charts and in the static HTML,
    each marked measured on this GPU or from public sources, with its source."""
    from xmem_jupyter.report import report_bundle
    from xmem_jupyter.widget import XmemWidget

    w = XmemWidget(est)
    html = report_bundle(est, widget=w)["text/html"]
    fm = est.fixed_memory
    assert fm is not None and fm.parts
    for view in (w.fixed_memory.value, html):
        text = unescape(view)
        assert "<details class='xmem-fixed'" in view
        rows = re.findall(r"<tr class='xmem-fixed-part'>(.*?)</tr>", view)
        assert len(rows) == len(fm.parts)
        for p, r in zip(fm.parts, rows):
            r = unescape(r)
            assert p.what in r and amount(p.bytes) in r and (p.source or "no source given") in r
            assert ("measured on this GPU" if p.measured else "from public sources") in r
        assert f"{sum(p.measured for p in fm.parts)} of {len(fm.parts)} parts measured on this GPU" in text
        if fm.driver_reserved is not None:
            assert "xmem-fixed-reserve" in view
    h100 = estimate(FRAGMENTED, "H100-SXM-80GB", namespace={}, mode="fake")
    assert not any(p.measured for p in h100.fixed_memory.parts)  # no datacenter GPU measured yet (issue #37)
    assert "0 of" in XmemWidget(h100).fixed_memory.value


def test_the_saved_report_carries_the_flame_chart(est):
    from xmem_jupyter.report import report_bundle

    flame = report_bundle(est)[REPORT_MIME]["flame"]
    n = len(flame["left"])
    assert n > 0 and all(len(flame[k]) == n for k in ("right", "bottom", "top", "cat", "label"))
    assert max(flame["label"]) < len(flame["labels"]) and max(flame["cat"]) < len(flame["categories"])
    assert flame["x_end"] == len(est.simulated_events)
    scale = 1 << 30 if flame["unit"] == "GiB" else 1 << 20
    assert max(flame["top"]) * scale == pytest.approx(est.peak_allocated_bytes, rel=0.01)


def test_a_large_step_keeps_the_saved_flame_chart_small():
    """Thousands of tensors: the report's flame chart stays within its rectangle budget."""
    from xmem_jupyter.flame import REPORT_MAX_RECTS, flame_report

    big = estimate("import torch\nxs = []\nfor i in range(3000):\n"
                   "    xs.append(torch.empty(1024 * (1 + i % 97), device='cuda'))\n"
                   "    if i % 3 == 0: xs.pop(0)\n", "T4", namespace={}, mode="fake")
    flame = flame_report(big)
    assert flame["n_tensors"] == 3000 and len(flame["left"]) <= REPORT_MAX_RECTS


def _luminance(colour: str) -> float:
    rgb = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast(a: str, b: str) -> float:
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def test_themed_colours_read_on_their_themes_backgrounds():
    """WCAG's 4.5:1 for text, each shade on its own theme's backgrounds (the fits / does not fit
    colours were 3.7:1 and 3.5:1 on JupyterLab Dark before they had a dark shade)."""
    from xmem_jupyter.palette import THEME_BACKGROUNDS, THEMED

    for name, (light, dark) in THEMED.items():
        for bg in THEME_BACKGROUNDS["light"]:
            assert contrast(light, bg) >= 4.5, (name, light, bg, contrast(light, bg))
        for bg in THEME_BACKGROUNDS["dark"]:
            assert contrast(dark, bg) >= 4.5, (name, dark, bg, contrast(dark, bg))
    # the capacity and the allocator's limit never look alike
    assert THEMED["capacity"] != THEMED["limit"]


def test_the_lab_extension_carries_the_current_palette():
    """labextension/style/palette.css is generated from palette.py (python -m xmem_jupyter.palette)."""
    from xmem_jupyter.palette import LAB_CSS, lab_css

    assert (ROOT / LAB_CSS).read_text() == lab_css(), "run: python -m xmem_jupyter.palette"
    assert "palette.css" in (ROOT / "labextension" / "style" / "index.css").read_text()
    assert "palette.css" in (ROOT / "labextension" / "style" / "index.js").read_text()


CELL = """
import torch, torch.nn as nn
batch = 8
model = nn.Linear(256, 256).cuda()
model(torch.randn(batch, 256, device="cuda")).sum().backward()
"""


@pytest.fixture()
def widget():
    from xmem_jupyter.session import Session
    from xmem_jupyter.widget import XmemWidget

    s = Session(source=CELL, namespace={}, gpus=["T4"], batch_var="batch", batch=8, batch_values=[4, 8, 16])
    return XmemWidget(s.estimate(8, "T4"), session=s)


def test_every_described_control_has_a_tooltip(widget):
    """ipywidgets writes a described control's tooltip into its label's title: None showed as
    title="null" on the GPU and batch labels."""
    import ipywidgets

    def walk(w):
        yield w
        for c in getattr(w, "children", ()):
            yield from walk(c)

    described = [w for w in walk(widget) if isinstance(w, ipywidgets.widgets.widget_description.DescriptionWidget)
                 and w.description]
    assert {w.description for w in described} >= {"GPU", "batch", "batch ="}
    assert all(w.tooltip for w in described), [w.description for w in described if not w.tooltip]


def _wait(w, timeout=120.0):
    t0 = time.time()
    time.sleep(0.05)
    while not w._busy.acquire(blocking=False):
        assert time.time() - t0 < timeout
        time.sleep(0.05)
    w._busy.release()


def test_the_batch_entry_takes_any_whole_number_and_says_what_it_refuses(widget):
    for bad, why in (("abc", "not a whole number"), ("0", "outside 1 to"), ("-3", "outside 1 to"),
                     (str(1 << 30), "outside 1 to")):
        widget.batch_entry.value = bad
        assert why in widget.batch_error.value and "role='alert'" in widget.batch_error.value, bad
        assert widget.batch == 8 and widget.batch_entry.value == "8"  # the entry says what is shown
    widget.batch_entry.value = "12"  # not a preset: the slider gains it and moves there
    _wait(widget)
    assert widget.batch_error.value == ""
    assert widget.batch == 12 and widget.batch_slider.value == 12 and 12 in widget.batch_slider.options
    assert widget.est.peak_allocated_bytes > 0 and widget.session.regions.traced == [12]  # traced, the batch a symbol
    widget.batch_slider.value = 16  # and the entry follows the slider
    _wait(widget)
    assert widget.batch_entry.value == "16"
