"""The static result: an HTML summary and the ``application/vnd.xmem.report+json`` bundle.

It travels in the same output as the widget's view (:func:`report_bundle`): a saved widget
whose kernel is gone renders as "model not found", so this is what a reader of the saved
notebook (or of GitHub's rendering) sees. Every string that
comes from the user's code (module names, ops, source lines) goes through ``html.escape``.
"""

from __future__ import annotations

from html import escape
from typing import Any, Iterable

from xmem_engine.advisor import Advice
from xmem_engine.estimate import REPORT_MIME, Estimate, gib

from xmem_jupyter.advice import advice_html

from xmem_jupyter.flame import human, source_labeler
from xmem_jupyter.palette import CATEGORY_COLORS, DEVICE_COLORS, FITS_COLOR, NOFIT_COLOR, palette

STYLE = ("font-family:var(--jp-ui-font-family,system-ui,sans-serif);font-size:13px;"
         "line-height:1.45;max-width:60em")


def verdict_html(est: Estimate) -> str:
    """The headline (``Estimate.headline``, the words every view shows), a bar of what the
    peak is made of against the GPU's capacity, and the split in words."""
    colour = FITS_COLOR if est.fits else NOFIT_COLOR
    mark = "&#10004;" if est.fits else "&#10008;"
    cached = max(0, est.reserved_at_peak_bytes - est.peak_allocated_bytes)
    bar = _bar([("CUDA context", est.context_bytes, DEVICE_COLORS["context"]),
                ("libraries", est.outside_allocator_bytes, DEVICE_COLORS["libraries"]),
                ("allocated", est.peak_allocated_bytes, DEVICE_COLORS["allocated"]),
                ("reserved, unused", max(0, est.peak_reserved_bytes - est.peak_allocated_bytes),
                 DEVICE_COLORS["cached"])],
               est.capacity_bytes)
    band = (f"<div class='xmem-range'>{escape(est.range_text)}</div>" if est.range_text else "")
    oom = (f"<div style='color:{NOFIT_COLOR}'>the simulated run runs out of memory before it finishes</div>"
           if est.oom else "")
    return (
        f"<div class='xmem-headline' style='{STYLE}'>"
        f"<div style='font-size:16px'><b style='color:{colour}' class='xmem-verdict'>{mark}</b> "
        f"<span class='xmem-headline-text'>{escape(est.headline)}</span></div>"
        f"{bar}{band}{oom}"
        f"<div>{escape(est.headline_detail)}; {gib(cached)} of the reserved memory is cached but unused "
        f"then: fragmentation and cache</div></div>"
    )


def _bar(parts: list[tuple[str, int, str]], total: int) -> str:
    cells = "".join(
        f"<div title='{escape(name)}: {human(v)}' style='width:{100.0 * v / total:.3f}%;background:{c}'></div>"
        for name, v, c in parts if total and v > 0)
    return (f"<div style='display:flex;height:12px;border:1px solid #888;border-radius:3px;overflow:hidden;"
            f"margin:4px 0;max-width:40em'>{cells}</div>")


def breakdown_html(est: Estimate, top: int = 8) -> str:
    """Categories, modules and tensors live at the peak."""
    label = source_labeler()
    td = "<td style='white-space:nowrap;padding:0 .5em'>"
    rows = "".join(
        f"<tr><td><span style='color:{CATEGORY_COLORS.get(k, '#888')}'>&#9632;</span> {escape(k)}</td>"
        f"<td style='text-align:right'>{human(v)}</td></tr>" for k, v in est.breakdown.items())
    mods = "".join(f"<tr><td><code>{escape(k)}</code></td><td style='text-align:right'>{human(v)}</td></tr>"
                   for k, v in list(est.breakdown_by_module.items())[:top])
    tens = "".join(
        f"<tr>{td}{human(t['bytes'])}</td>{td}{escape(str(t.get('category', '')))}</td>"
        f"{td}<code>{escape(str(tuple(t.get('shape', ()))))}</code> {escape(str(t.get('dtype', '')))}</td>"
        f"{td}<code>{escape(str(t.get('module', '')))}</code></td>{td}{escape(str(t.get('op', '')))}</td>"
        f"{td}{escape(label(str(t.get('source', ''))))}</td></tr>" for t in est.top_tensors[:top])
    return (
        f"<div style='{STYLE};display:flex;gap:2em;flex-wrap:wrap'>"
        f"<table><caption style='text-align:left'><b>At the peak</b></caption>{rows}</table>"
        f"<table><caption style='text-align:left'><b>Top modules</b></caption>{mods}</table>"
        f"<table><caption style='text-align:left'><b>Largest tensors live at the peak</b></caption>"
        f"<tr><th>size</th><th>category</th><th>shape</th><th>module</th><th>op</th><th>line</th></tr>"
        f"{tens}</table></div>"
    )


def compare_html(ests: Iterable[Estimate]) -> str:
    """One row per GPU: does it fit? A row re-simulated from a trace of another GPU
    architecture whose attention backend may differ there is starred, with the caveat below."""
    ests = list(ests)
    rows = "".join(
        f"<tr><td>{escape(e.gpu_name)}{'*' if e.backend_caveat else ''}</td>"
        f"<td style='text-align:right'>{human(e.peak_device_bytes)}</td>"
        f"<td style='text-align:right'>{human(e.capacity_bytes)}</td>"
        f"<td style='color:{FITS_COLOR if e.fits else NOFIT_COLOR}'>{'fits' if e.fits else 'does not fit'}</td></tr>"
        for e in ests)
    caveats = [e.backend_caveat for e in ests if e.backend_caveat]
    foot = (f"<div class='xmem-backend-caveat' style='{STYLE};color:#666;font-size:12px'>* {escape(caveats[0])}</div>"
            if caveats else "")
    return (f"<table style='{STYLE}'><tr><th>GPU</th><th>peak</th><th>capacity</th><th></th></tr>{rows}</table>"
            + foot)


def summary_html(est: Estimate, others: Iterable[Estimate] = (), max_batch: dict[str, int] | None = None) -> str:
    """The text/html of the static output."""
    others = list(others)
    parts = [verdict_html(est)]
    if others:
        parts.append(compare_html([est, *others]))
    if max_batch:
        items = ", ".join(f"{escape(g)}: {b}" for g, b in max_batch.items())
        parts.append(f"<div style='{STYLE}'>largest batch that fits: {items}</div>")
    # folded: under a live widget it repeats what the widget shows; a saved notebook opens it
    parts.append(f"<details style='{STYLE}'><summary>at the peak: categories, modules, largest tensors</summary>"
                 f"{breakdown_html(est)}</details>")
    notes = "".join(f"<li>{escape(n)}</li>" for n in est.notes)
    if notes:
        parts.append(f"<ul style='{STYLE}'>{notes}</ul>")
    parts.append(f"<div style='{STYLE};color:#666'>xmem: traced in {escape(est.mode)} mode, "
                 f"{est.n_events:,} events, {est.seconds:.1f} s; alloc conf "
                 f"{escape(est.alloc_conf or '(default)')}</div>")
    return "<div class='xmem-report'>" + "".join(parts) + "</div>"


WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def report_bundle(est: Estimate, others: Iterable[Estimate] = (), max_batch: dict[str, int] | None = None,
                  widget: Any = None, advice: Advice | None = None) -> dict:
    """The MIME bundle for ``display(..., raw=True)``: the report, and with ``widget`` its view too.

    One output per cell carries both. The lab extension (``labextension/src/live.ts``) shows
    the widget while its kernel holds it and the report otherwise; other front ends pick one
    type: widget-aware ones the widget, static renderers (nbconvert, GitHub) the ``text/html``,
    a terminal the ``text/plain`` line (never the widget's ``XmemWidget(children=...)`` repr).
    ``advice`` (what would make it fit, measured for ``est``) goes into all three.
    """
    others = list(others)
    report = {**est.to_report(), "palette": palette()}
    html, text = summary_html(est, others, max_batch), one_line(est, others)
    if advice is not None:
        report["advice"] = advice.to_json()
        html = html.removesuffix("</div>") + advice_html(advice) + "</div>"
        if advice.combination:
            text += f" | cheapest change that fits: {' + '.join(advice.combination)}"
    bundle = {REPORT_MIME: report, "text/html": html, "text/plain": text}
    if widget is not None:
        bundle[WIDGET_MIME] = {"version_major": 2, "version_minor": 0, "model_id": widget.model_id}
    return bundle


def one_line(est: Estimate, others: Iterable[Estimate] = ()) -> str:
    """The ``--quiet`` output: one line, all GPUs, each by the name every other view uses."""
    parts = []
    for e in [est, *others]:
        parts.append(f"{e.gpu_name}: peak {human(e.peak_device_bytes)} of {human(e.capacity_bytes)}, "
                     f"{'fits' if e.fits else 'DOES NOT FIT'}")
    w = est.world
    rank = f" (rank {w['rank']} of {w['size']})" if w and w.get("size", 1) > 1 else ""
    return "xmem: " + " | ".join(parts) + rank
