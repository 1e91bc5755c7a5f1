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
from xmem_engine.estimate import REPORT_MIME, Estimate

from xmem_jupyter.advice import advice_html

from xmem_jupyter.figures import Figure, amount, device_split, readings_text, report_figures, split_text, steady_text
from xmem_jupyter.flame import flame_report, human, source_labeler
from xmem_jupyter.palette import CATEGORY_COLORS, DEVICE_COLORS, palette, stylesheet, var

STYLE = ("font-family:var(--jp-ui-font-family,system-ui,sans-serif);font-size:13px;"
         "line-height:1.45;max-width:60em")


def verdict_html(est: Estimate) -> str:
    """The headline (``Estimate.headline``, the words every view shows), a bar of what the
    device peak is made of against the GPU's capacity, and the same split in words: every
    figure and its name from :func:`xmem_jupyter.figures.figures`; under it the first step's
    peak where it differs from the steady state's, and the peak as total - free reads it."""
    colour = var("fits" if est.fits else "nofit")
    mark = "&#10004;" if est.fits else "&#10008;"
    bar = _bar([(f, DEVICE_COLORS[DEVICE_KEYS[f.key]]) for f in device_split(est)], est)
    band = (f"<div class='xmem-range'>{escape(est.range_text)}</div>" if est.range_text else "")
    oom = (f"<div class='xmem-oom' style='color:{var('nofit')}'>the simulated run runs out of memory before it "
           "finishes</div>" if est.oom else "")
    steady = steady_text(est)
    return (
        f"<div class='xmem-headline' style='{STYLE}'>"
        f"<div style='font-size:16px' role='heading' aria-level='3'>"
        f"<b style='color:{colour}' class='xmem-verdict' aria-hidden='true'>{mark}</b> "
        f"<span class='xmem-headline-text' style='color:{colour}'>{escape(est.headline)}</span></div>"
        f"{bar}{band}{oom}"
        f"<div class='xmem-split'>{escape(split_text(est))}</div>"
        + (f"<div class='xmem-steady'>{escape(steady)}</div>" if steady else "")
        + f"<div class='xmem-readings' style='color:{var('fg2')}'>{escape(readings_text(est))}</div></div>"
    )


def fixed_memory_html(est: Estimate) -> str:
    """The fixed memory's parts (context, kernels, cuDNN, NCCL: what this step pays), folded:
    each one's figure, whether it was measured on this GPU or comes from public sources (with
    the range the estimate allows for it), and its source; the driver's reserve below them."""
    fm = est.fixed_memory
    if fm is None:
        return ""
    td = "<td style='padding:0 .5em;vertical-align:top'>"

    def row(p, kind: str) -> str:
        spread = "" if (p.low_bytes, p.high_bytes) == (p.bytes, p.bytes) else f"{amount(p.low_bytes)} - {amount(p.high_bytes)}"
        return (f"<tr class='xmem-fixed-{kind}'>{td}{escape(p.what)}</td>{td}{amount(p.bytes)} ({p.bytes >> 20:,} MiB)"
                f"</td>{td}{'measured on this GPU' if p.measured else 'from public sources'}</td>{td}{spread}</td>"
                f"{td}<span style='overflow-wrap:anywhere'>{escape(p.source or 'no source given')}</span></td></tr>")

    rows = "".join(row(p, "part") for p in fm.parts)
    if fm.driver_reserved is not None:
        rows += row(fm.driver_reserved, "reserve")
    measured = sum(p.measured for p in fm.parts)
    summary = (f"fixed memory {amount(fm.bytes)}: CUDA context and libraries outside the allocator; "
               f"{measured} of {len(fm.parts)} parts measured on this GPU, "
               + ("the rest from public sources" if measured < len(fm.parts) else "none from public sources alone"))
    return (f"<details class='xmem-fixed' style='{STYLE}'><summary>{escape(summary)}</summary>"
            f"<table><caption style='text-align:left'>what the process holds before and besides its tensors"
            f"{' (the driver reserve: total - free counts it, nvidia-smi does not)' if fm.driver_reserved else ''}"
            f"</caption><tr><th scope='col'>part</th><th scope='col'>amount</th><th scope='col'>figure</th>"
            f"<th scope='col'>range allowed</th><th scope='col'>source</th></tr>{rows}</table></details>")


#: the device bar's parts (figures.DEVICE_SPLIT) -> their colour in palette.DEVICE_COLORS
DEVICE_KEYS = {"context": "context", "libraries": "libraries", "allocated_peak": "allocated",
               "reserved_above": "cached"}


def _bar(parts: list[tuple[Figure, str]], est: Estimate) -> str:
    """The device bar: each part's width against the capacity (or the peak, when larger), its
    tooltip the figure's name and amount; a text alternative for screen readers."""
    total = max(est.capacity_bytes, est.peak_device_bytes)
    cells = "".join(
        f"<div class='xmem-seg xmem-seg-{f.key}' title='{escape(f.text)}: {escape(f.about)}' "
        f"style='width:{100.0 * f.bytes / total:.3f}%;background:{c}'></div>"
        for f, c in parts if total and f.bytes > 0)
    label = escape(f"{split_text(est)}; GPU capacity {amount(est.capacity_bytes)}")
    return (f"<div class='xmem-devicebar' role='img' aria-label='{label}' style='display:flex;height:12px;"
            f"border:1px solid {var('border')};border-radius:3px;overflow:hidden;margin:4px 0;max-width:40em'>"
            f"{cells}</div>")


def breakdown_html(est: Estimate, top: int = 8) -> str:
    """Categories, modules and tensors live at the allocated peak (figures.py: when the tensors
    hold the most at once)."""
    label = source_labeler()
    td = "<td style='white-space:nowrap;padding:0 .5em'>"
    rows = "".join(
        f"<tr><td><span class='xmem-swatch' aria-hidden='true' style='color:{CATEGORY_COLORS.get(k, '#888')}'>"
        f"&#9632;</span> {escape(k)}</td>"
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
        f"<table><caption style='text-align:left'><b>At the allocated peak</b></caption>{rows}</table>"
        f"<table><caption style='text-align:left'><b>Top modules at the allocated peak</b></caption>{mods}</table>"
        f"<table><caption style='text-align:left'><b>Largest tensors live at the allocated peak</b></caption>"
        f"<tr><th>size</th><th>category</th><th>shape</th><th>module</th><th>op</th><th>line</th></tr>"
        f"{tens}</table></div>"
    )


def compare_html(ests: Iterable[Estimate]) -> str:
    """One row per GPU: does it fit? A row re-simulated from a trace of another GPU
    architecture whose attention backend may differ there is starred, with the caveat below."""
    ests = list(ests)
    rows = "".join(
        f"<tr><td>{escape(e.gpu_name)}{'*' if e.backend_caveat else ''}</td>"
        f"<td style='text-align:right'>{amount(e.peak_device_bytes)}</td>"
        f"<td style='text-align:right'>{amount(e.capacity_bytes)}</td>"
        f"<td style='color:{var('fits' if e.fits else 'nofit')}'>{'fits' if e.fits else 'does not fit'}</td></tr>"
        for e in ests)
    caveats = [e.backend_caveat for e in ests if e.backend_caveat]
    foot = (f"<div class='xmem-backend-caveat' style='{STYLE};color:{var('fg2')};font-size:12px'>* {escape(caveats[0])}</div>"
            if caveats else "")
    return (f"<table style='{STYLE}' class='xmem-compare'><caption style='text-align:left'>the step on each GPU "
            f"given</caption><tr><th scope='col'>GPU</th><th scope='col'>peak device memory</th>"
            f"<th scope='col'>GPU capacity</th><th scope='col'>verdict</th></tr>{rows}</table>"
            + foot)


def summary_html(est: Estimate, others: Iterable[Estimate] = (), max_batch: dict[str, int] | None = None) -> str:
    """The text/html of the static output."""
    others = list(others)
    parts = [f"<style>{stylesheet()}</style>", verdict_html(est)]
    if others:
        parts.append(compare_html([est, *others]))
    if max_batch:
        items = ", ".join(f"{escape(g)}: {b}" for g, b in max_batch.items())
        parts.append(f"<div style='{STYLE}'>largest batch that fits: {items}</div>")
    # folded: under a live widget it repeats what the widget shows; a saved notebook opens it
    parts.append(f"<details style='{STYLE}'><summary>at the allocated peak: categories, modules, largest tensors</summary>"
                 f"{breakdown_html(est)}</details>")
    parts.append(fixed_memory_html(est))
    notes = "".join(f"<li>{escape(n)}</li>" for n in est.notes)
    if notes:
        parts.append(f"<ul style='{STYLE}'>{notes}</ul>")
    parts.append(f"<div style='{STYLE};color:{var('fg2')}'>xmem: traced in {escape(est.mode)} mode, "
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
    report = {**est.to_report(), "palette": palette(), "figures": report_figures(est)}
    flame = flame_report(est)
    if flame is not None:
        report["flame"] = flame
    html, text = summary_html(est, others, max_batch), one_line(est, others)
    if advice is not None:
        report["advice"] = advice.to_json()  # its "ranking" states how cost is judged
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
        parts.append(f"{e.gpu_name}: peak {amount(e.peak_device_bytes)} of {amount(e.capacity_bytes)}, "
                     f"{'fits' if e.fits else 'DOES NOT FIT'}")
    w = est.world
    rank = f" (rank {w['rank']} of {w['size']})" if w and w.get("size", 1) > 1 else ""
    return "xmem: " + " | ".join(parts) + rank
