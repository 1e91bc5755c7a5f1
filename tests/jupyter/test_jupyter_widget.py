"""The widget and the static report, driven from Python (no browser)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("jupyter_bokeh")

from xmem_engine.batch_family import same_trace  # noqa: E402
from xmem_engine.estimate import REPORT_MIME, BatchSearch, estimate_trace  # noqa: E402
from xmem_jupyter.bokeh_loader import bokeh_loader  # noqa: E402
from xmem_jupyter.report import report_bundle, summary_html, verdict_html  # noqa: E402
from xmem_jupyter.session import Session, with_expandable  # noqa: E402
from xmem_jupyter.widget import XmemWidget  # noqa: E402

CELL = """
import torch, torch.nn as nn
batch = 32
model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512)).cuda()
opt = torch.optim.Adam(model.parameters())
for _ in range(2):
    x = torch.randn(batch, 512, device="cuda")
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.fixture(scope="module")
def session():
    s = Session(source=CELL, namespace={}, gpus=["A100-SXM4-40GB", "T4"], batch_var="batch", batch=32,
                batch_values=[16, 32, 64], filename="In[9]")
    s.estimate(32, "A100-SXM4-40GB")
    return s


def _wait(widget: XmemWidget, timeout: float = 120.0) -> None:
    t0 = time.time()
    time.sleep(0.05)
    while not widget._busy.acquire(blocking=False):
        assert time.time() - t0 < timeout, "background work did not finish"
        time.sleep(0.05)
    widget._busy.release()


def test_gpu_switch_resimulates_and_updates_everything(session):
    est = session.estimate(32, "A100-SXM4-40GB")
    first_trace = est.trace
    seen = []
    w = XmemWidget(est, session=session, on_change=seen.append)
    assert "A100" in w.headline.value and "fits" in w.headline.value
    assert "Tesla T4" in w.compare.value  # --gpu given twice: a comparison table
    bundle_before = json.dumps(w.bokeh.render_bundle)
    sent, states = [], []
    w.bokeh.send = lambda content, buffers=None: sent.append(content)  # what goes to the browser
    w.bokeh.send_state = lambda key=None: states.append(key)
    traces_before = dict(session.traces)
    w.gpu_dropdown.value = "H100-SXM-80GB"  # how fast: benchmarks/widget_speed.py
    assert w.est.gpu == "H100-SXM-80GB" and "H100" in w.headline.value
    assert seen and seen[-1].gpu == "H100-SXM-80GB"
    assert w.est.trace is first_trace  # re-simulation, no re-tracing
    assert session.traces == traces_before
    assert any(m.get("msg") == "patch" for m in sent)
    assert json.dumps(w.bokeh.render_bundle) == bundle_before
    # the kernel's copy follows when the state is asked for (a reloaded page draws this one)
    assert json.dumps(w.bokeh.get_state()["render_bundle"]) != bundle_before
    from xmem_jupyter.charts import legend_labels
    from xmem_jupyter.timeline import build_timeline

    h100_capacity = legend_labels(build_timeline(w.est, w.flame.x_end))["capacity"]  # "GPU capacity 79.18 GiB"
    assert h100_capacity in json.dumps(w.bokeh.render_bundle) and h100_capacity not in bundle_before
    assert not states  # nothing re-sent to the browser
    assert len(session.traces) == 1


def test_expandable_toggle_reports_what_it_saves(session):
    w = XmemWidget(session.estimate(32, "A100-SXM4-40GB"), session=session)
    w.expandable.value = True
    assert "expandable_segments:True" in w.conf and w.est.alloc_conf == w.conf
    assert "expandable segments" in w.conf_note.value and ("saves" in w.conf_note.value or "costs" in w.conf_note.value)
    w.expandable.value = False
    assert "expandable" not in w.conf
    assert with_expandable("max_split_size_mb:128,expandable_segments:True", False) == "max_split_size_mb:128"


@pytest.mark.parametrize("threaded", [False, True], ids=["main-thread", "threaded"])
def test_batch_slider_retraces_and_caches(session, threaded):
    session.traces.pop(64, None)
    session.family, session.family_note = None, ""
    session.regions, session.symbolic_note = None, ""
    session.derived_traces.clear()
    session.estimates = {k: v for k, v in session.estimates.items() if k[0] != 64}
    w = XmemWidget(session.estimate(32, "A100-SXM4-40GB"), session=session, threaded=threaded)
    assert w.batch_slider is not None and list(w.batch_slider.options) == [16, 32, 64]
    peak32 = w.est.peak_allocated_bytes
    ns_before = dict(session.namespace)  # the first trace's plain values (batch, _)
    w.batch_slider.value = 64
    _wait(w)
    assert w.batch == 64 and w.est.peak_allocated_bytes > peak32
    assert w.charts.flame_source.data["right"].max() == w.flame.x_end  # redrawn for the new trace
    assert 64 not in session.traces and session.regions.traced == [64]  # traced once, the batch a symbol
    traces_before = dict(session.traces)
    w.batch_slider.value = 32  # cached: no trace
    assert session.traces == traces_before and w.est.peak_allocated_bytes == peak32
    assert session.namespace == ns_before == {"batch": 32, "_": 1}  # the slider never writes to the user's namespace


@pytest.mark.parametrize("symbolic", [True, False], ids=["symbolic", "two-traces"])
def test_after_a_second_trace_the_slider_runs_no_code(symbolic):
    # the batch as a symbol: one trace at the second size holds every size; where the cell needs
    # it as a number (here a made-up range() over it), the family of two real traces does
    cell = CELL if symbolic else CELL + "ids = list(range(batch))\n"
    s = Session(source=cell, namespace={}, gpus=["A100-SXM4-40GB"], batch_var="batch", batch=32,
                batch_values=[16, 32, 48, 64])
    w = XmemWidget(s.estimate(32, "A100-SXM4-40GB"), session=s, threaded=False)
    w.batch_slider.value = 64  # the second batch size: traced
    assert sorted(s.traces) == ([32] if symbolic else [32, 64]) and "was not traced" not in " ".join(w.est.notes)
    assert (s.regions.traced == [64]) if symbolic else ("batch was fixed at 64" in s.symbolic_note)
    charts = w.charts
    w.batch_slider.value = 48  # no code run
    assert sorted(s.traces) == ([32] if symbolic else [32, 64]) and w.batch == 48
    assert w.charts is charts  # the same events: the charts' data is patched, not rebuilt and resent
    assert any(("batch = 48 was not traced" if symbolic else "batch size 48 was not traced") in n
               for n in w.est.notes)
    real = estimate_trace(s.fresh_trace(48), "A100-SXM4-40GB")
    assert same_trace(w.est.trace, real.trace)
    assert (w.est.peak_allocated_bytes, w.est.peak_reserved_bytes) == (real.peak_allocated_bytes,
                                                                       real.peak_reserved_bytes)
    w.batch_slider.value = 16  # below both: the family still
    assert sorted(s.traces) == ([32] if symbolic else [32, 64]) and w.est.peak_allocated_bytes < real.peak_allocated_bytes


# the cell's own branch on the batch size (line 5): above 600 it keeps one more buffer
BRANCH_CELL = ("import torch\nbatch = 8\nw = torch.zeros(256, 256, device='cuda', requires_grad=True)\n"
               "x = torch.randn(batch, 256, device='cuda')\n"
               "keep = torch.empty(batch * 64, 256, device='cuda') if batch > 600 else None\n"
               "(x @ w).square().sum().backward()\n")


def test_a_real_trace_the_family_does_not_make_ends_the_family():
    s = Session(source=BRANCH_CELL, namespace={}, gpus=["T4"], batch_var="batch", batch=8, batch_values=[8, 16])
    s.symbolic_note = "off for this test: the family of two real traces"
    s.estimate(8, "T4"), s.estimate(16, "T4")
    wrong = s.estimate(700, "T4")  # the family's: it misses the branch
    assert s.family is not None and wrong.trace.meta.get("batch_family")
    right = s.estimate(700, "T4", real=True)
    assert right.peak_allocated_bytes > wrong.peak_allocated_bytes
    assert s.family is None and "not the real trace at 700" in s.family_note
    assert s.estimate(700, "T4") is right
    s.estimate(300, "T4")
    assert 300 in s.traces  # traced: no family any more


def test_a_branch_on_the_batch_is_a_guard_of_the_symbolic_trace_and_traced_past():
    s = Session(source=BRANCH_CELL, namespace={}, gpus=["T4"], batch_var="batch", batch=8, batch_values=[8, 16])
    s.estimate(8, "T4"), s.estimate(16, "T4")
    assert s.regions.traced == [16] and s.regions.families[0].broken_at(700).startswith("<cell>:5: ")
    past = s.estimate(700, "T4")  # past the guard (batch <= 600): a symbolic trace of its own
    assert s.regions.traced == [16, 700] and sorted(s.traces) == [8]
    assert same_trace(past.trace, s.fresh_trace(700))
    assert same_trace(s.estimate(300, "T4").trace, s.fresh_trace(300)) and s.regions.traced == [16, 700]


def test_largest_batch_readout():
    # 256 MiB a sample: the answer (about 55 on a T4) is a few cheap traces away
    big = Session(source="import torch\nbatch = 32\nt = torch.empty(batch, 64, 1 << 20, device='cuda')\n",
                  namespace={}, gpus=["T4"], batch_var="batch", batch=32, batch_values=[32, 64])
    w = XmemWidget(big.estimate(32, "T4"), session=big)
    w._on_find()
    _wait(w, 300)
    assert "largest batch that fits Tesla T4" in w.largest.value  # the GPU's name, as in the headline
    best = big.largest[("T4", "")]
    assert 40 <= best <= 60
    assert f">{best}<" in w.largest.value
    # it can be applied: the slider (64 at most) gains the value and moves there
    assert w.apply_button.layout.display is None and w.apply_button.description == f"use {best}"
    w._on_apply_largest()
    _wait(w, 300)
    assert best in w.batch_slider.options and w.batch_slider.value == best == w.batch
    assert w.est.fits and w.apply_button.layout.display == "none"


def test_largest_batch_of_a_variable_memory_does_not_follow():
    """The search does not report its limit as the answer: the batch variable here sizes
    nothing on the GPU, so the widget says any batch fits (it used to show 16384)."""
    flat = Session(source="import torch\nbatch = 32\nt = torch.empty(64, 1 << 20, device='cuda')\n",
                   namespace={}, gpus=["T4"], batch_var="batch", batch=32, batch_values=[32, 64])
    w = XmemWidget(flat.estimate(32, "T4"), session=flat)
    w._on_find()
    _wait(w, 300)
    assert flat.searches[("T4", "")].unbounded == "independent"
    assert ">any<" in w.largest.value and "does not change the peak" in w.largest.value
    assert "16384" not in w.largest.value


def test_report_escapes_user_strings_and_carries_the_mime(session):
    est = session.estimate(32, "A100-SXM4-40GB")
    evil = dataclasses.replace(est, breakdown_by_module={"<img src=x onerror=alert(1)>": 1024},
                               top_tensors=[{**est.top_tensors[0], "module": "<script>bad()</script>"}])
    html = summary_html(evil)
    assert "<script>" not in html and "<img src=x" not in html and "&lt;script&gt;" in html
    bundle = report_bundle(est)
    assert set(bundle) == {REPORT_MIME, "text/html", "text/plain"}
    assert bundle[REPORT_MIME]["gpu"] == "A100-SXM4-40GB"
    schema = Path(__file__).resolve().parents[2] / "xmem_engine" / "data" / "report.schema.json"
    if schema.exists():
        jsonschema = pytest.importorskip("jsonschema")
        jsonschema.validate(bundle[REPORT_MIME], json.loads(schema.read_text()))
    json.dumps(bundle)  # JSON-ready


def test_markup_in_a_users_catalog_is_text(tmp_path, monkeypatch):
    """A GPU key and name with markup in the user's catalog file never reach the widget's HTML raw."""
    evil = "<img src=x onerror=alert(1)>"
    f = tmp_path / "gpus.toml"
    f.write_text(f'[gpus."{evil}"]\nname = "{evil} GPU"\ntotal_memory_bytes = 8589934592\n'
                 'compute_capability = "8.6"\nsm_count = 10\ncublas_workspace_bytes = 8519680\n'
                 'context_bytes = 314572800\n')
    monkeypatch.setenv("XMEM_GPUS_FILE", str(f))
    s = Session(source="import torch\nbatch = 4\nt = torch.empty(batch, 1 << 20, device='cuda')\n",
                namespace={}, gpus=[evil], batch_var="batch", batch=4, batch_values=[4, 8])
    w = XmemWidget(s.estimate(4, evil), session=s)
    s.searches[(evil, "")] = BatchSearch(4, None)
    w._least[(4, evil, "")] = 1 << 30
    w._refresh_text()
    html = "".join(x.value for x in (w.headline, w.compare, w.largest, w.least, w.breakdown, w.notes))
    assert "<img" not in html and "&lt;img" in html


def test_bokehjs_loader_is_inline_and_shared():
    out = bokeh_loader()
    assert out is bokeh_loader()
    assert len(out.outputs) == 1
    data = out.outputs[0]["data"]
    assert list(data) == ["application/javascript"]  # once, not twice (see bokeh_loader)
    js = data["application/javascript"]
    assert "cdn.bokeh.org" not in js[:5000] and len(js) > 1_000_000  # BokehJS itself, inline


def test_least_memory_readout_on_request(session):
    w = XmemWidget(session.estimate(32, "A100-SXM4-40GB"), session=session)
    assert w.least.value == ""  # not computed until asked: it costs a dozen re-simulations
    w._on_least()
    _wait(w)
    least = w._least[(w.batch, w.est.gpu, w.conf)]
    e = w.est
    assert e.context_bytes + e.outside_allocator_bytes + e.peak_allocated_bytes <= least <= e.peak_device_bytes
    assert "runs in as little as" in w.least.value and "A100-SXM4-40GB" in w.least.value
    w.gpu_dropdown.value = "T4"  # another GPU: its own figure, shown once asked for
    assert w.least.value == ""


def test_the_comparison_table_carries_the_attention_backend_caveat():
    """A GPU of another architecture, re-simulated from the trace, is starred and explained."""
    from xmem_engine.estimate import estimate
    from xmem_jupyter.report import compare_html

    est = estimate("import torch\nq = torch.randn(2, 4, 128, 64, device='cuda', requires_grad=True)\n"
                   "torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()\n",
                   "A100-40GB", namespace={})
    table = compare_html([est, est.resimulate("T4")])
    assert "Tesla T4*" in table and "A100-SXM4-40GB*" not in table and "compute capability 8.0" in table


@pytest.mark.parametrize("rows", [4, 12 << 10])  # 4 KiB a row: a step far below a T4, and one far above
def test_the_timeline_shows_the_limits_never_clips_and_marks_the_oom(rows):
    from xmem_engine.estimate import estimate
    from xmem_jupyter.charts import build_charts, timeline_title
    from xmem_jupyter.flame import build_flame
    from xmem_jupyter.timeline import build_timeline

    est = estimate(f"import torch\nxs = [torch.empty({rows}, 1 << 20, device='cuda') for _ in range(3)]\n",
                   "T4", mode="fake")
    fl = build_flame(est.simulated_events)
    tl = build_timeline(est, fl.x_end)
    charts = build_charts(fl, tl)
    top = charts.timeline_fig.y_range.end
    assert tl.unit == "GiB" and charts.timeline_fig.yaxis[0].axis_label == "GiB"  # one unit: the axis, the title
    assert top >= tl.capacity >= tl.allocator_limit  # the capacity is always on the chart...
    assert top >= max(tl.columns["reserved"])  # ...and nothing is cut off above it
    assert len(timeline_title(tl)) <= 70 and "GiB" in timeline_title(tl) and "MiB" not in timeline_title(tl)
    if est.fits:
        assert not charts.oom.visible
    else:  # where the run on this GPU fails is marked
        assert est.oom and charts.oom.visible and charts.oom.location == est.oom_event
        assert charts.oom_label.text == f"out of memory here (event {est.oom_event:,})"
        assert charts.oom_label.y >= tl.allocator_limit  # at the top: clear of the limits' lines


def test_one_palette_for_every_view(session):
    """Colours are defined once (palette.py): no other module of the notebook front names a
    colour of its own, and the saved report carries them so the lab extension draws the same."""
    import re

    from xmem_jupyter.palette import CATEGORY_COLORS, palette

    root = Path(__file__).resolve().parents[2] / "xmem_jupyter"
    for f in root.glob("*.py"):
        if f.name != "palette.py":
            assert not re.findall(r"#[0-9a-fA-F]{6}\b", f.read_text()), f.name
    bundle = report_bundle(session.estimate(32, "A100-SXM4-40GB"))
    assert bundle[REPORT_MIME]["palette"] == palette()
    assert bundle[REPORT_MIME]["palette"]["categories"]["activation"] == CATEGORY_COLORS["activation"]


def test_the_timeline_carries_the_calibrated_range(session):
    from xmem_jupyter.charts import _limits
    from xmem_jupyter.timeline import build_timeline

    est = session.estimate(32, "A100-SXM4-40GB")
    if est.peak_range is None:
        pytest.skip("no calibration (xmem_engine/data/calibration.json)")
    tl = build_timeline(est, len(est.timeline.event))
    scale = (1 << 30) if tl.unit == "GiB" else (1 << 20)
    fixed = est.context_bytes + est.outside_allocator_bytes
    assert tl.range_low == pytest.approx((est.peak_range.low_bytes - fixed) / scale)
    assert tl.range_low <= est.peak_reserved_bytes / scale <= tl.range_high <= tl.top
    assert _limits(tl)["range_high"] == [tl.range_high]
    assert est.range_text in verdict_html(est)


def test_the_family_is_not_waited_for_while_another_thread_traces():
    s = Session(source=CELL, namespace={}, gpus=["T4"], batch_var="batch", batch=32, batch_values=[32, 64])
    s.estimate(32, "T4"), s.estimate(64, "T4")
    assert s.derived(48) is not None
    held = threading.Event()
    release = threading.Event()

    def tracing():  # as the widget's background trace holds the session
        with s.lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=tracing)
    t.start()
    held.wait(10)
    try:
        assert s.derived(56) is None  # at once, not after the trace: the widget says it is busy
    finally:
        release.set()
        t.join()
    assert s.derived(56) is not None


@pytest.mark.parametrize("symbolic", [True, False], ids=["symbolic", "two-traces"])
def test_a_cell_that_tests_the_batch_for_a_value_is_traced_at_that_value(symbolic):
    cell = CELL.replace("batch = 32\n", "batch = 32\nif batch == 48:\n    raise ValueError('48 is not supported')\n")
    s = Session(source=cell, namespace={}, gpus=["T4"], batch_var="batch", batch=32, batch_values=[32, 64])
    s.symbolic_note = "" if symbolic else "off for this test"
    s.estimate(32, "T4"), s.estimate(64, "T4")
    if symbolic:  # the test is a guard (batch != 48): every other size is the symbolic trace's
        assert s.derived(40) is not None and "Ne(" in s.regions.families[0].broken_at(48)
    else:  # a family of two traces cannot see it: each size is traced
        assert s.derived(40) is None and "batch == 48" in s.family_note
    with pytest.raises(ValueError, match="48 is not supported"):
        s.estimate(48, "T4")  # a family of 32 and 64 would have shown a peak
