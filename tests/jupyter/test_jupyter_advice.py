"""What would make it fit, in the notebook: ``%%xmem --advise``, the widget's panel, the saved
report's ``advice``, and each lever measured on a cell that uses objects made before it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

IPython = pytest.importorskip("IPython")
jsonschema = pytest.importorskip("jsonschema")

from xmem_engine.estimate import REPORT_MIME  # noqa: E402
from xmem_jupyter.flame import human  # noqa: E402

GPU = "RTX-4060-8GB"
SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "xmem_engine" / "data" / "report.schema.json").read_text())

# eight repeated blocks whose activations do not fit an 8 GB card at batch 128
DEEP = """
import torch, torch.nn as nn
batch = 128
model = nn.Sequential(*[nn.Sequential(nn.Linear(2048, 2048), nn.GELU()) for _ in range(8)], nn.Linear(2048, 10)).cuda()
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(batch, 512, 2048, device="cuda")
y = torch.randint(0, 10, (batch, 512), device="cuda")
loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
loss.backward()
opt.step()
opt.zero_grad()
"""


@pytest.fixture()
def shown(ip, monkeypatch):
    """The bundles the magic displays and the updates to them, in order."""
    import xmem_jupyter.magic as magic

    out: dict[str, list] = {"shown": [], "updates": []}

    class Handle:
        def update(self, obj, raw=False):
            out["updates"].append(obj)

        def close(self):
            pass

    def fake_display(obj, raw=False, display_id=None):
        if isinstance(obj, dict):
            out["shown"].append(obj)
        return Handle()

    monkeypatch.setattr(magic, "display", fake_display)
    before = set(ip.user_ns)
    yield out
    for k in set(ip.user_ns) - before:
        ip.user_ns.pop(k, None)


def _widget(bundle: dict):
    from ipywidgets.widgets.widget import _instances

    return _instances[bundle["application/vnd.jupyter.widget-view+json"]["model_id"]]


def test_advise_flag_puts_the_levers_in_the_widget_and_the_report(ip, shown):
    init, call = torch.optim.AdamW.__init__, torch.nn.Module.__call__
    res = ip.run_cell(f"%%xmem --gpu {GPU} --batch-var batch --advise\n" + DEEP)
    assert res.success, res.error_in_exec
    (bundle,) = [b for b in shown["shown"] if REPORT_MIME in b]
    report = bundle[REPORT_MIME]
    jsonschema.validate(report, SCHEMA)
    advice = report["advice"]
    assert advice["fits"] is False and advice["batch_var"] == "batch" and advice["batch"] == 128
    by = {lv["lever"]: lv for lv in advice["levers"]}
    assert by["activation checkpointing"]["fits"] and by["gradient accumulation x2"]["detail"] == "micro-batch 64"
    assert by["activation checkpointing"]["peak_device_bytes"] < 0.7 * advice["peak_device_bytes"]
    assert advice["combination"] and "Cheapest change that fits" in bundle["text/html"]
    # how "cheapest" is judged, in the widget, the static HTML and the saved report alike
    from html import escape

    from xmem_jupyter.advice import RANKING

    assert advice["ranking"] == RANKING and escape(RANKING) in bundle["text/html"]
    assert "cheapest change that fits: " in bundle["text/plain"]
    widget = _widget(bundle)
    assert "xmem-advice" in widget.advice_panel.value and widget.advice_view.layout.display is None
    # the patches are gone, and the cell's own values are as a plain run leaves them
    assert torch.optim.AdamW.__init__ is init and torch.nn.Module.__call__ is call
    assert ip.user_ns["batch"] == 128 and "model" not in ip.user_ns


def test_advise_without_batch_var_takes_the_cells_batch_and_says_so(ip, shown):
    # issue #35 item 3: a cell assigning `batch = ...` got no accumulation or smaller-batch lever
    res = ip.run_cell(f"%%xmem --gpu {GPU} --advise\n" + DEEP)
    assert res.success, res.error_in_exec
    (bundle,) = [b for b in shown["shown"] if REPORT_MIME in b]
    advice = bundle[REPORT_MIME]["advice"]
    jsonschema.validate(bundle[REPORT_MIME], SCHEMA)
    assert advice["batch_var"] == "batch" and advice["batch_var_inferred"] is True
    assert "gradient accumulation x2" in {lv["lever"] for lv in advice["levers"]}
    assert "the one batch-size name the cell assigns" in bundle["text/html"]


def test_the_panel_measures_on_request_and_shows_a_lever_on_the_charts(ip, shown):
    res = ip.run_cell(f"%%xmem --gpu {GPU} --batch-var batch\n" + DEEP)
    assert res.success, res.error_in_exec
    (bundle,) = [b for b in shown["shown"] if REPORT_MIME in b]
    assert "advice" not in bundle[REPORT_MIME]
    widget = _widget(bundle)
    assert widget.advice_panel.value == "" and widget.advice_view.layout.display == "none"
    widget.advise_button.click()
    advice = widget.current_advice()
    assert advice is not None and advice.baseline is widget.est
    assert shown["updates"] and shown["updates"][-1][REPORT_MIME]["advice"]["combination"] == advice.combination
    n_updates = len(shown["updates"])
    # a lever on the charts: its estimate is drawn, the saved report stays the cell's
    lever = next(m for m in advice.levers if m.lever.name == "activation checkpointing")
    widget.advice_view.value = "activation checkpointing"
    assert widget.est is lever.estimate and "fits" in widget.headline.value
    assert len(shown["updates"]) == n_updates
    widget.advice_view.value = ""
    assert widget.est is advice.baseline
    # another GPU: the advice was measured for the RTX 4060, so the panel asks again
    widget.gpu_dropdown.value = "A100-SXM4-80GB"
    assert widget.current_advice() is None and widget.advice_panel.value == ""
    assert "advice" not in shown["updates"][-1][REPORT_MIME]


def test_levers_reach_objects_made_before_the_cell(ip, shown):
    """A notebook builds the model and imports the optimizer's class in earlier cells; the
    Adafactor swap and the autocast wrap still apply (to copies: the user's objects stay)."""
    from xmem_jupyter.advice import advise_cell
    from xmem_jupyter.session import Session

    ip.run_cell("import torch, torch.nn as nn\nfrom torch.optim import AdamW\n"
                "net = nn.Sequential(*[nn.Linear(4096, 4096) for _ in range(6)])")
    before = {k: v.clone() for k, v in ip.user_ns["net"].state_dict().items()}
    cell = ("\nmodel = net.cuda()\nopt = AdamW(model.parameters())\nfor _ in range(2):\n"
            "    model(torch.randn(256, 4096, device='cuda')).sum().backward()\n    opt.step()\n    opt.zero_grad()\n")
    session = Session(source=cell, namespace=ip.user_ns, gpus=[GPU])
    advice = advise_cell(session, GPU)
    by = {m.lever.name: m for m in advice.levers}
    # AdamW's two states per parameter (1.5 GiB here) are held through the second step's
    # forward and backward; Adafactor's factored state is a few KiB
    saved = advice.baseline.peak_device_bytes - by["Adafactor instead of Adam(W)"].peak_device_bytes
    assert saved > 1.0 * (1 << 30), advice.summary()
    # autocast reached the model made before: its bf16 copies of the weights (autocast's cast
    # cache, 192 MiB) outweigh what this weight-heavy step saves on activations
    assert by["autocast bfloat16"].peak_device_bytes > advice.baseline.peak_device_bytes + (128 << 20)
    assert all(torch.equal(before[k], v) for k, v in ip.user_ns["net"].state_dict().items())
    assert next(ip.user_ns["net"].parameters()).device.type == "cpu"
    assert ip.user_ns["AdamW"] is torch.optim.AdamW and "opt" not in ip.user_ns


def test_lever_timelines_side_by_side_on_one_scale():
    """Static HTML (it survives a reload and a kernel restart), one y scale, each panel's title
    saying the peak and fits or not in words, every panel's figure as the headline prints it."""
    import re

    from xmem_engine.advisor import advise
    from xmem_jupyter.advice import lever_timelines
    from xmem_jupyter.figures import amount

    script = Path(__file__).resolve().parents[1] / "advise_scripts" / "transformer.py"
    plain = advise(str(script), GPU, overrides={"batch_size": "2"})
    grid = lever_timelines(plain, ["activation checkpointing", "autocast bfloat16"], columns=3)
    assert [p.name for p in grid.panels] == ["as written", "autocast bfloat16", "activation checkpointing"]
    ckpt = next(m for m in plain.levers if m.lever.name == "activation checkpointing")
    title = grid.panels[2].title
    assert amount(ckpt.peak_device_bytes) in title and title.endswith("fits" if ckpt.fits else "does not fit")
    html = grid._repr_html_()
    import ipywidgets

    assert "<script" not in html and not isinstance(grid, ipywidgets.Widget)  # needs no kernel, no trust
    assert html.count("<svg viewBox") == 3 and html.count("role='img'") == 3
    # one scale: every panel's y ticks are the same
    ticks = [re.findall(r"text-anchor='end' font-size='10'[^>]*>([\d.]+)</text>", p.svg) for p in grid.panels]
    assert len({tuple(t) for t in ticks}) == 1 and len(ticks[0]) >= 2
    assert grid.limit_text in html

@pytest.mark.parametrize("cell, slider", [
    ("batch_size = 16\nx = torch.randn(batch_size, 256, device='cuda')\n", "batch_size"),
    ("cfg = dict(per_device_train_batch_size=16)\nx = torch.randn(cfg['per_device_train_batch_size'], 256, "
     "device='cuda')\n", "per_device_train_batch_size"),
    ("batch = 8\nbatch = 16\nx = torch.randn(batch, 256, device='cuda')\n", None),  # which is it?
    ("x = torch.randn(16, 256, device='cuda')\n", None),
])
def test_the_slider_needs_no_flag_where_the_batch_has_one_name(ip, shown, cell: str, slider: str | None):
    """The batch-size slider for the one batch-size name the cell gives one positive integer:
    a new user does not know ``--batch-var``. A cell that assigns two values gets none: the
    slider would set both."""
    res = ip.run_cell(f"%%xmem --gpu {GPU}\nimport torch\n" + cell)
    assert res.success, res.error_in_exec
    (bundle,) = [b for b in shown["shown"] if REPORT_MIME in b]
    widget = _widget(bundle)
    if slider is None:
        assert widget.batch_slider is None
        return
    assert widget.batch_slider.description == slider and widget.batch_slider.value == 16
    before = widget.est.peak_allocated_bytes
    widget.batch_entry.value = "64"
    deadline = time.time() + 60
    while widget.batch != 64 or widget.est.peak_allocated_bytes == before:
        assert time.time() < deadline
        time.sleep(0.05)
    assert widget.est.peak_allocated_bytes - before >= (64 - 16) * 256 * 4
