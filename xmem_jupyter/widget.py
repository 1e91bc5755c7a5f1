"""The interactive result of ``%%xmem``: headline, breakdown, flame chart, timeline, controls.

Layout (top to bottom): the headline (peak vs capacity, fits or not, headroom, the split into
CUDA context / reserved / allocated, the first step's peak where it differs, the total - free
reading); the controls (GPU, allocator toggle, batch slider,
largest-batch readout); progress; the flame chart over the memory timeline (one Bokeh layout,
x linked); the breakdown at the peak; the fixed memory's parts (folded).

A GPU or allocator change re-simulates the existing trace (``estimate_trace``) and reaches
the browser as Bokeh patches (milliseconds). A batch-size change re-traces (results cached per
value) and re-sends the charts whole (``update_from_model``). After patches, the kernel's copy
of the Bokeh document (``render_bundle``, what a page reloaded against the same kernel draws)
is refreshed quietly a moment later, without sending it: the browser already shows it. The
static report in the same output (``report.report_bundle``) always follows.

The progress indicator runs in a thread of its own; the trace itself runs on the kernel's
main thread by default (``threaded=False``): the tracer patches ``torch`` process-wide while
it runs, so a cell the user starts meanwhile must wait rather than run against the virtual
GPU. The front end stays responsive either way; ``threaded=True`` frees the kernel too, for
code that drives the widget from Python and knows nothing else runs.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from html import escape
from typing import Callable

import ipywidgets as widgets
from jupyter_bokeh import BokehModel

from xmem_engine.advisor import Advice
from xmem_engine.estimate import REPORT_MIME, Estimate
from xmem_engine.resimulation import minimum_memory
from xmem_engine.gpus import cudnn, load_catalog

from xmem_jupyter.advice import advice_html, advise_cell, measured
from xmem_jupyter.bokeh_loader import bokeh_loader
from xmem_jupyter.charts import Charts, build_charts
from xmem_jupyter.flame import FlameData, build_flame, human
from xmem_jupyter.progress import Progress, TracerProbe
from xmem_jupyter.figures import amount, chart_text
from xmem_jupyter.palette import stylesheet, var
from xmem_jupyter.report import breakdown_html, compare_html, fixed_memory_html, verdict_html
from xmem_jupyter.session import Session, expandable_on, with_expandable
from xmem_jupyter.timeline import build_timeline


#: the largest batch size the entry takes (a typo's 10**9 would trace for minutes)
MAX_BATCH = 1 << 20

#: the widget's own layout rules, beside the theme's colours (palette.stylesheet)
WIDGET_CSS = (
    ".xmem-widget{max-width:100%;box-sizing:border-box;color:var(--xmem-fg)}"
    ".xmem-widget .xmem-charts{max-width:100%}"
    ".xmem-widget .widget-html-content{white-space:normal;line-height:1.45}"
    ".xmem-widget table{max-width:100%}"
    ".xmem-widget :focus-visible{outline:2px solid var(--xmem-focus);outline-offset:1px}"
)


class ChartsModel(BokehModel):
    """The charts' widget. Changes reach the browser as Bokeh patches; the whole document in
    the widget's state (what a reloaded page draws) is serialised again only when the state
    is asked for: 0.4 s each time, which after every patch held up the next slider move."""

    def __init__(self, model, lock: threading.RLock, **kwargs) -> None:
        self.stale = False  # patched since render_bundle was made
        self._lock = lock  # the widget's: the document changes in its background thread
        super().__init__(model, **kwargs)

    def get_state(self, key=None, drop_defaults=False):
        if self.stale and (key is None or "render_bundle" in ([key] if isinstance(key, str) else key)):
            with self._lock:
                self.stale = False
                # set in the value store, not through the trait: a change would re-send it all
                self._trait_values["render_bundle"] = self._model_to_traits(self._model)
        return super().get_state(key, drop_defaults)


def _descendants(w: widgets.Widget):
    yield w
    for c in getattr(w, "children", ()):
        yield from _descendants(c)


@dataclass
class SwitchTiming:
    """How long the last GPU / allocator change took (the benchmark prints it)."""

    simulate_s: float = 0.0
    update_s: float = 0.0


class XmemWidget(widgets.VBox):
    """The widget for one estimate. ``session`` (from the magic) enables re-tracing for
    other batch sizes; without it the widget shows ``est`` and re-simulates its trace."""

    def __init__(self, est: Estimate, *, session: Session | None = None, gpus: list[str] | None = None,
                 on_change: Callable[[Estimate], None] | None = None, width: int = 900,
                 threaded: bool = False, **kwargs):
        self.session = session
        self.est = est
        self.batch = session.batch if session else None
        self.conf = est.alloc_conf if session is None else session.alloc_conf
        self.on_change = on_change
        self.last_switch = SwitchTiming()
        self.width = width
        self.threaded = threaded
        self._cache: dict[tuple, Estimate] = {(self.batch, est.gpu, self.conf): est}
        self._flame_key: tuple | None = None
        self._busy = threading.Lock()
        self._doc_lock = threading.RLock()  # Bokeh document: mutated by show(), read by the refresh

        catalog = load_catalog()
        chosen = list(dict.fromkeys(gpus or (session.gpus if session else [est.gpu])))
        others = [k for k in catalog if k not in chosen]
        options = [(f"{catalog[k].name} ({amount(catalog[k].total_memory_bytes)})", k) for k in chosen + others]
        self.compared = chosen

        self.style = widgets.HTML(f"<style>{stylesheet()}{WIDGET_CSS}</style>", layout=widgets.Layout(display="none"))
        self.headline = widgets.HTML(verdict_html(est))
        self.headline.add_class("xmem-headline-widget")
        self.compare = widgets.HTML()
        self.gpu_dropdown = widgets.Dropdown(options=options, value=est.gpu, description="GPU",
                                             tooltip="the GPU to estimate for: another re-simulates the same trace",
                                             layout=widgets.Layout(width="26em", max_width="100%"))
        self.gpu_dropdown.add_class("xmem-gpu")
        self.expandable = widgets.ToggleButton(value=expandable_on(self.conf), description="expandable segments",
                                               tooltip="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (a toggle)",
                                               icon="arrows-v", layout=widgets.Layout(width="14em"))
        self.conf_note = widgets.HTML()
        # torch.compile on or off: shown where the cell compiles (its trace says so), each mode a
        # Session of its own, so switching back is a lookup (compile time is paid once per mode)
        compiles = bool((est.trace.meta.get("compile") or {}).get("comparable"))
        self.compile_toggle = widgets.ToggleButton(
            value=(session.compile if session else None) != "eager",
            description=f"torch.compile {'off' if session and session.compile == 'eager' else 'on'}",
            icon="bolt", layout=widgets.Layout(width="12em", display=None if compiles and session else "none"),
            tooltip="the cell's torch.compile: on, compiled for this GPU by Inductor; off, the same code eager")
        self.compile_toggle.add_class("xmem-compile")
        self.compile_note = widgets.HTML()
        self.compile_note.add_class("xmem-compile-note")
        self._modes: dict[str, tuple] = {}  # compile mode -> (session, estimates, least, advice) not shown
        self.largest = widgets.HTML()
        self.find_button = widgets.Button(description="largest batch that fits", icon="search",
                                          tooltip="search the largest batch size that fits this GPU",
                                          layout=widgets.Layout(width="15em"))
        self.apply_button = widgets.Button(description="use it", icon="check", layout=widgets.Layout(
            width="8em", display="none"), tooltip="set the batch slider to the largest batch that fits")
        self.apply_button.add_class("xmem-apply-largest")
        self.apply_button.on_click(self._on_apply_largest)
        self.least = widgets.HTML()
        self.least_button = widgets.Button(
            description="least memory", icon="compress", layout=widgets.Layout(width="11em"),
            tooltip="the least device memory this step runs in: with less, or under a cap, the allocator "
                    "frees its cache and retries, so this is below the peak")
        self._least: dict[tuple, int] = {}
        self.progress = Progress()
        # "what would make it fit": the advisor's levers measured on the cell (xmem_jupyter.advice)
        self.advice: dict[tuple, Advice] = {}  # (batch, gpu, conf) -> the levers measured there
        self.advise_button = widgets.Button(
            description="what would make it fit", icon="wrench", layout=widgets.Layout(width="16em"),
            tooltip="apply each usual change (allocator settings, optimizer, autocast, checkpointing, "
                    "accumulation, a smaller batch) to this step and estimate it again")
        self.advise_button.add_class("xmem-advise")
        self.advise_button.on_click(self._on_advise)
        self.advice_panel = widgets.HTML()
        self.advice_view = widgets.Dropdown(description="charts show", options=[("as written", "")], value="",
                                            tooltip="draw the step as written, or with one measured change",
                                            layout=widgets.Layout(width="30em", display="none"))
        self.advice_view.add_class("xmem-advice-view")
        self.advice_view.observe(self._on_advice_view, "value")
        self.breakdown = widgets.HTML(breakdown_html(est))
        # the fixed memory's parts, folded: which were measured on this GPU, which come from public sources
        self.fixed_memory = widgets.HTML(fixed_memory_html(est))
        self.fixed_memory.add_class("xmem-fixed-memory")
        # the report as it stands, for the lab extension to save into the cell's output
        # (labextension/src/live.ts): a widget callback cannot update that output itself
        self.report_data = widgets.HTML(layout=widgets.Layout(display="none"))
        self.report_data.add_class("xmem-report-data")
        self.notes = widgets.HTML()

        controls = [self.gpu_dropdown, self.expandable, self.compile_toggle, self.least_button]
        self.least_button.on_click(self._on_least)
        self.batch_slider: widgets.SelectionSlider | None = None
        self.batch_entry: widgets.Text | None = None
        self.batch_error = widgets.HTML()
        self.batch_error.add_class("xmem-batch-error")
        if session is not None and session.batch_var and session.batch_values:
            var_name = session.batch_var
            label = len(var_name) * 0.65  # em: the whole name shows (per_device_train_batch_size)
            self.batch_slider = widgets.SelectionSlider(
                options=session.batch_values, value=session.batch, description=var_name,
                tooltip=f"{var_name}: preset values; another re-traces the cell", continuous_update=False,
                style={"description_width": "initial"},
                layout=widgets.Layout(width=f"{max(22, 14 + label):.0f}em", max_width="100%"))
            self.batch_slider.add_class("xmem-batch-slider")
            self.batch_slider.observe(self._on_batch, "value")
            # any value, typed: the slider's readout takes only its presets
            self.batch_entry = widgets.Text(
                value=str(session.batch), description=f"{var_name} =", continuous_update=False,
                placeholder="any whole number", tooltip=f"type any {var_name} (a whole number > 0) and press Enter",
                style={"description_width": "initial"}, layout=widgets.Layout(width=f"{max(13, 7 + label):.0f}em"))
            self.batch_entry.add_class("xmem-batch-entry")
            self.batch_entry.observe(self._on_batch_entry, "value")
            controls += [self.batch_slider, self.batch_entry, self.find_button]
            self.find_button.on_click(self._on_find)
        if session is not None:
            controls.append(self.advise_button)

        self.flame: FlameData = self._flame_for(est)
        tl = build_timeline(est, self.flame.x_end)
        self.charts: Charts = build_charts(self.flame, tl, width=width)
        self.bokeh = ChartsModel(self.charts.layout, self._doc_lock, layout=widgets.Layout(width="100%", max_width=f"{width + 40}px",
                                                                           overflow="auto hidden"))
        self.bokeh.add_class("xmem-charts")
        # the charts in words: a screen reader's text, and the labels the lab extension gives them
        self.chart_summary = widgets.HTML()
        self.chart_summary.add_class("xmem-chart-summary")

        self.gpu_dropdown.observe(self._on_gpu, "value")
        self.expandable.observe(self._on_conf, "value")
        self.compile_toggle.observe(self._on_compile, "value")
        self._refresh_text()
        super().__init__([bokeh_loader(), self.style, self.headline, self.compare,
                          widgets.HBox(controls, layout=widgets.Layout(flex_flow="row wrap")), self.batch_error,
                          widgets.HBox([self.conf_note, self.compile_note, self.largest, self.apply_button, self.least],
                                       layout=widgets.Layout(flex_flow="row wrap")),
                          self.progress, self.advice_panel, self.advice_view, self.chart_summary, self.bokeh,
                          self.breakdown, self.fixed_memory, self.notes, self.report_data], **kwargs)
        self.add_class("xmem-widget")
        # ipywidgets writes a tooltip of None into its (hidden) label as title="null"
        for w in _descendants(self):
            if isinstance(w, widgets.widgets.widget_description.DescriptionWidget) and w.tooltip is None:
                w.tooltip = w.description or ""

    # ----------------------------------------------------------------- estimates
    def _estimate(self, batch: int | None, gpu: str, conf: str) -> Estimate:
        key = (batch, gpu, conf)
        if key in self._cache and self.session is not None and batch not in self.session.traces \
                and key not in self.session.estimates:
            del self._cache[key]  # from the batch family, which a real trace since ended (session.py)
        if key not in self._cache:
            if self.session is not None:
                self._cache[key] = self.session.estimate(batch, gpu, conf)
            else:
                self._cache[key] = self.est.resimulate(gpu, conf)
        return self._cache[key]

    def _flame_for(self, est: Estimate) -> FlameData:
        """The flame chart changes only with the trace and the library workspaces: cuBLAS's size
        (per GPU) and cuDNN's measured table (per architecture, when there is one)."""
        if est.target:
            table = cudnn.table_for(est.target)
            key = (id(est.trace), est.target.cublas_workspace_bytes, table.compute_capability if table else None)
        else:
            key = (id(est.trace), est.gpu, None)
        if key != self._flame_key or not hasattr(self, "flame"):
            self._flame_key = key
            return build_flame(est.simulated_events or [])
        return self.flame

    # ----------------------------------------------------------------- redraw
    def show(self, est: Estimate, follow: bool = True) -> None:
        """Make ``est`` the displayed estimate (``follow``: the saved report follows it; not for a
        lever's estimate viewed from the advice panel, which is not the cell's).

        Data of the same shape (a GPU or allocator change; another batch size from the batch
        family: the same events, other sizes): the changed data goes to the browser as Bokeh
        patches, a few milliseconds. Otherwise (a new trace of another shape): the charts are
        rebuilt and sent whole, which also refreshes the Bokeh document kept in saved widget state.
        """
        t0 = time.perf_counter()
        new_trace = est.trace is not self.est.trace
        self.est = est
        # the figures first: they reach the page before the charts' data, which takes longer to draw
        self.headline.value = verdict_html(est)
        self.breakdown.value = breakdown_html(est)
        self.fixed_memory.value = fixed_memory_html(est)
        flame = self._flame_for(est)
        timeline = build_timeline(est, flame.x_end)
        with self._doc_lock:
            if new_trace and not self.charts.takes(flame, timeline):
                doc = self.charts.layout.document
                if doc is not None:
                    doc.remove_on_change(self.bokeh)  # the new document is sent once, whole
                self.flame = flame
                self.charts = build_charts(flame, timeline, width=self.width)
                self.bokeh.update_from_model(self.charts.layout)
            else:
                doc = self.charts.layout.document
                if doc is not None:
                    doc.hold("combine")  # one patch per changed property, sent together
                try:
                    if flame is not self.flame:  # another trace, or cuBLAS workspaces of another size
                        self.flame = flame
                        self.charts.update_flame(flame)
                    self.charts.update_timeline(timeline)
                finally:
                    if doc is not None:
                        doc.unhold()
                self.bokeh.stale = True
        self._refresh_text()
        self.last_switch.update_s = time.perf_counter() - t0
        if follow and self.on_change is not None:
            self.on_change(est)

    def _refresh_text(self) -> None:
        est = self.est
        if len(self.compared) > 1:
            self.compare.value = compare_html(self._estimate(self.batch, g, self.conf) for g in self.compared)
        key = (est.gpu, self.conf)
        search = self.session.searches.get(key) if self.session is not None else None
        if search is not None:
            how, best = search.unbounded, search.value
            why = (f" ({escape(self.session.batch_var or '')} does not change the peak)" if how == "independent"
                   else " (the search stopped at its limit, still fitting)" if how == "limit" else "")
            self.largest.value = (f"&nbsp; largest {escape(self.session.batch_var or '')} that fits "
                                  f"{escape(est.gpu_name)}: <b class='xmem-largest'>{search.answer()}</b>{why}")
            usable = how != "independent" and best > 0 and best != self.batch
            self.apply_button.description = f"use {best}"
            self.apply_button.layout.display = None if usable else "none"
        elif self.session is not None and self.session.batch_var:
            self.largest.value = ""
            self.apply_button.layout.display = "none"
        least = self._least.get((self.batch, est.gpu, self.conf))
        self.least.value = "" if least is None else (
            f"&nbsp; runs in as little as <b class='xmem-least'>{amount(least)}</b> on {escape(est.gpu_name)} "
            f"(peak {amount(est.peak_device_bytes)}; no margin for variation)")
        self._refresh_advice()
        if self._modes:
            self._note_compile()
        notes = list(est.notes) + list(self.flame.notes)
        self.notes.value = "".join(f"<div style='color:{var('fg2')};font-size:12px'>{escape(n)}</div>" for n in notes)
        self.chart_summary.value = (f"<div class='xmem-chart-text' style='color:{var('fg2')};font-size:12px'>"
                                    f"{escape(chart_text(est, self.flame))}</div>")

    # ----------------------------------------------------------------- controls
    def _on_gpu(self, change) -> None:
        t0 = time.perf_counter()
        est = self._estimate(self.batch, change["new"], self.conf)
        self.last_switch.simulate_s = time.perf_counter() - t0
        self.show(est)
        if self.expandable.value != expandable_on(self.conf) or self.conf_note.value:
            self._note_conf()

    def _on_conf(self, change) -> None:
        self.conf = with_expandable(self.conf, bool(change["new"]))
        self.show(self._estimate(self.batch, self.est.gpu, self.conf))
        self._note_conf()

    def _note_conf(self) -> None:
        """What expandable segments change on this GPU (peak device memory, both ways)."""
        on = self._estimate(self.batch, self.est.gpu, with_expandable(self.conf, True))
        off = self._estimate(self.batch, self.est.gpu, with_expandable(self.conf, False))
        saved = off.peak_device_bytes - on.peak_device_bytes
        word = "saves" if saved >= 0 else "costs"
        self.conf_note.value = (f"expandable segments {word} <b class='xmem-saves'>{human(abs(saved))}</b> "
                                f"(peak {amount(on.peak_device_bytes)} with, {amount(off.peak_device_bytes)} without)")

    def _on_compile(self, change) -> None:
        """The cell traced again with ``torch.compile`` on (Inductor, for the GPU) or off (eager),
        in a Session of its own (a copy of the namespace); then what compiling saves."""
        assert self.session is not None
        mode = "inductor" if change["new"] else "eager"
        self.compile_toggle.description = f"torch.compile {'on' if change['new'] else 'off'}"
        current = self.session.compile or "inductor"
        if mode == current:
            return
        self._modes[current] = (self.session, self._cache, self._least, self.advice)
        session, cache, least, advice = self._modes.pop(mode, None) or (self.session.with_compile(mode), {}, {}, {})
        self.session, self._cache, self._least, self.advice = session, cache, least, advice
        probe = TracerProbe()

        def work() -> Estimate:
            self.session.trace(self.batch, (probe.setup,))
            return self._estimate(self.batch, self.est.gpu, self.conf)

        self._background(f"tracing with torch.compile {'on' if change['new'] else 'off'}:", work, probe)

    def _note_compile(self) -> None:
        """What compiling saves on this GPU, where both modes are traced for this batch."""
        assert self.session is not None
        mode = self.session.compile or "inductor"
        other = self._modes.get("eager" if mode == "inductor" else "inductor")
        if other is None or self.batch not in other[0].traces:
            self.compile_note.value = ""
            return
        ests = {mode: self._estimate(self.batch, self.est.gpu, self.conf),
                "eager" if mode == "inductor" else "inductor": other[0].estimate(self.batch, self.est.gpu, self.conf)}
        saved = ests["eager"].peak_device_bytes - ests["inductor"].peak_device_bytes
        self.compile_note.value = (
            f"&nbsp; torch.compile {'saves' if saved >= 0 else 'costs'} <b class='xmem-compile-saves'>"
            f"{human(abs(saved))}</b> (peak {amount(ests['inductor'].peak_device_bytes)} compiled, "
            f"{amount(ests['eager'].peak_device_bytes)} eager)")

    def _background(self, message: str, work: Callable[[], Estimate | None], probe=lambda: None) -> None:
        """Run ``work`` with the progress indicator (in a thread of its own if ``threaded``)."""
        if not self._busy.acquire(blocking=False):
            self.progress.stop("busy: wait for the running trace to finish")
            return
        self.progress.start(message, probe)

        def run() -> None:
            try:
                est = work()
            except KeyboardInterrupt:  # the kernel was interrupted: stop quietly, stay usable
                self.progress.stop("interrupted")
            except Exception as e:  # shown in the widget: a callback has no cell to raise into
                self.progress.stop(f"failed: {type(e).__name__}: {e}")
            else:
                self.progress.stop()
                if est is not None:
                    self.show(est)
            finally:
                self._busy.release()

        if self.threaded:
            threading.Thread(target=run, name="xmem-retrace", daemon=True).start()
        else:
            run()

    def _on_batch(self, change) -> None:
        assert self.session is not None
        value = change["new"]
        self._set_entry(value)
        if (value, self.est.gpu, self.conf) in self._cache or value in self.session.traces \
                or self.session.derived(value) is not None:  # the batch family's: no code to run
            self.batch = value
            self.show(self._estimate(value, self.est.gpu, self.conf))
            return
        probe = TracerProbe()

        def work() -> Estimate:
            self.session.trace(value, (probe.setup,))
            self.batch = value
            return self._estimate(value, self.est.gpu, self.conf)

        self._background(f"tracing {self.session.batch_var}={value}:", work, probe)

    def _on_least(self, _button=None) -> None:
        """The least device memory the shown estimate runs in (``minimum_memory``): a dozen
        re-simulations, so on request, not on every switch."""
        est, key = self.est, (self.batch, self.est.gpu, self.conf)

        def work() -> None:
            if key not in self._least:
                self._least[key] = minimum_memory(est)
            self._refresh_text()
            return None

        self._background(f"finding the least memory on {est.gpu}:", work)

    def _add_batch_option(self, value: int) -> None:
        """Give the slider ``value`` (kept in order) without moving it."""
        assert self.session is not None and self.batch_slider is not None
        if value not in self.session.batch_values:
            self.session.batch_values = sorted(set(self.session.batch_values) | {value})
            current = self.batch_slider.value
            self.batch_slider.unobserve(self._on_batch, "value")
            self.batch_slider.options = self.session.batch_values
            self.batch_slider.value = current
            self.batch_slider.observe(self._on_batch, "value")

    def _on_apply_largest(self, _button=None) -> None:
        """Show the largest batch that fits: the slider gains that value (its range follows
        the search) and moves to it, which traces it as any slider move does."""
        assert self.session is not None and self.batch_slider is not None
        search = self.session.searches.get((self.est.gpu, self.conf))
        if search is None or not search.value:
            return
        self._add_batch_option(search.value)
        self.batch_slider.value = search.value

    def _on_batch_entry(self, change) -> None:
        """A typed batch size: any whole number from 1 to ``MAX_BATCH``; the slider gains it and
        moves there (which traces it). Anything else is said next to the controls, and the
        entry goes back to the batch size shown."""
        assert self.session is not None and self.batch_slider is not None and self.batch_entry is not None
        text = str(change["new"]).strip().replace(",", "").replace("_", "")
        name = self.session.batch_var
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not 1 <= value <= MAX_BATCH:
            why = "not a whole number" if value is None else f"outside 1 to {MAX_BATCH:,}"
            self.batch_error.value = (f"<div role='alert' style='color:{var('nofit')}'>{escape(name or 'batch')} = "
                                      f"{escape(str(change['new']))[:40]}: {why}; still {self.batch}</div>")
            self._set_entry(self.batch)
            return
        self.batch_error.value = ""
        if value == self.batch_slider.value:
            self._set_entry(value)
            return
        self._add_batch_option(value)
        self.batch_slider.value = value

    def _set_entry(self, value) -> None:
        if self.batch_entry is not None and self.batch_entry.value != str(value):
            self.batch_entry.unobserve(self._on_batch_entry, "value")
            self.batch_entry.value = str(value)
            self.batch_entry.observe(self._on_batch_entry, "value")

    def _on_find(self, _button=None) -> None:
        assert self.session is not None

        def work() -> None:
            self.session.largest_batch(self.est.gpu, self.conf)
            self._refresh_text()
            return None

        self._background(f"searching the largest {self.session.batch_var} for {self.est.gpu}:", work)

    def carry_report(self, bundle: dict) -> None:
        """Carry the cell's current report (``report.report_bundle``'s report, HTML and text)
        in the view, where the lab extension takes it into the saved output."""
        keep = {k: bundle[k] for k in (REPORT_MIME, "text/html", "text/plain") if k in bundle}
        self.report_data.value = f"<div class='xmem-report-json' hidden>{escape(json.dumps(keep))}</div>"

    # ----------------------------------------------------------------- what would make it fit
    def advice_key(self) -> tuple:
        return (self.batch, self.gpu_dropdown.value, self.conf)

    def set_advice(self, advice: Advice) -> None:
        """Advice measured elsewhere (``%%xmem --advise``) for what the controls show now."""
        self.advice[self.advice_key()] = advice
        self._refresh_advice()

    def current_advice(self) -> Advice | None:
        """The levers measured for what the controls show now (GPU, batch, allocator)."""
        return self.advice.get(self.advice_key())

    def _refresh_advice(self) -> None:
        advice = self.current_advice()
        self.advice_panel.value = "" if advice is None else advice_html(advice)
        options = [("as written", "")] + [(n, n) for n, _ in measured(advice)[1:]] if advice else [("as written", "")]
        if list(self.advice_view.options) != options:
            self.advice_view.unobserve(self._on_advice_view, "value")
            self.advice_view.options = options
            self.advice_view.value = ""
            self.advice_view.observe(self._on_advice_view, "value")
        self.advice_view.layout.display = None if advice else "none"

    def _on_advise(self, _button=None) -> None:
        """Measure every lever on this step (about one re-trace per lever: tens of seconds)."""
        assert self.session is not None
        key, base = self.advice_key(), self._estimate(self.batch, self.gpu_dropdown.value, self.conf)

        def work() -> None:
            if key not in self.advice:
                say = lambda m: self.progress.start(f"what would make it fit: measuring {m}:")  # noqa: E731
                self.advice[key] = advise_cell(self.session, key[1], batch=key[0], alloc_conf=key[2], base=base,
                                               progress=say)
            self._refresh_text()
            if self.on_change is not None:  # the saved report carries the advice
                self.on_change(base)
            return None

        self._background("what would make it fit:", work)

    def _on_advice_view(self, change) -> None:
        """Show a lever's estimate on the charts (or the step as written again)."""
        advice = self.current_advice()
        if advice is None:
            return
        name = change["new"]
        est = dict(measured(advice)).get(name) if name else None
        if est is None:
            self.show(self._estimate(self.batch, self.gpu_dropdown.value, self.conf), follow=False)
        else:
            self.show(est, follow=False)
        self.advice_view.value = name  # show() refreshes the panel; keep the choice
