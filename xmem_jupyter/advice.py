"""What would make it fit, for a ``%%xmem`` cell: the advisor's levers measured on the cell.

:func:`advise_cell` runs :func:`xmem_engine.advisor.measure` with the cell as the step: each
lever's patches are in place while the cell is traced again in a copy of the namespace (the
cell's own traces and the user's variables stay as they were). :func:`advice_html` is the
panel the widget and the saved report show; :func:`lever_timelines` draws each lever's memory
timeline side by side on one scale, for teaching, as static HTML that a saved notebook keeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Callable

import numpy as np

from xmem_engine.advisor import Advice, Lever, Measured, applied, measure
from xmem_engine.advisor_cost import RANKING
from xmem_engine.estimate import Estimate, estimate_trace, resolve_gpu

from xmem_jupyter.figures import amount
from xmem_jupyter.palette import LINE_COLORS, stylesheet, var
from xmem_jupyter.session import Session
from xmem_jupyter.timeline import thin

STYLE = "font-family:var(--jp-ui-font-family,system-ui,sans-serif);font-size:13px;line-height:1.45"
CODE = "overflow-wrap:anywhere;white-space:pre-wrap"  # long settings wrap rather than widen the table


def advise_cell(session: Session, gpu: str, *, batch: int | None = None, alloc_conf: str | None = None,
                base: Estimate | None = None, progress: Callable[[str], None] | None = None) -> Advice:
    """Every lever on the cell of ``session``, for ``gpu`` at batch ``batch`` (default: the
    cell's) with allocator setting ``alloc_conf`` (default: the session's). ``base`` is that
    estimate when the caller has it."""
    target = resolve_gpu(gpu)
    batch = session.batch if batch is None else batch
    conf = session.alloc_conf if alloc_conf is None else alloc_conf

    def run(levers: list[Lever], value: int | None, c: str) -> tuple[Estimate, dict]:
        with applied(levers, target) as info:
            tr = session.fresh_trace(batch if value is None else value, gpu=target.key)
        return estimate_trace(tr, target, c or None), info

    return measure(run, target, batch_var=session.batch_var if batch else None, batch=batch, alloc_conf=conf,
                   base=base, progress=progress, symbolic=None if session.mode == "real" else session.family_at)


def advice_html(advice: Advice) -> str:
    """The levers as a table (cheapest first: measured peak, fits or not, cost, the change to
    make), how the order is judged, and the cheapest change that fits, with its code. Peaks
    are printed as the headline prints them (``figures.amount``)."""
    b = advice.baseline
    rows = []
    for m in advice.levers:
        if m.error:
            peak, verdict, colour = "", f"not measured: {m.error}", "inherit"
        elif not m.applicable:
            peak, verdict, colour = "", f"n/a: {m.detail}", "inherit"
        else:
            peak = amount(m.peak_device_bytes)
            verdict = ("fits" if m.fits else "does not fit") + (f" ({m.detail})" if m.detail else "")
            colour = var("fits" if m.fits else "nofit")
        rows.append(f"<tr class='xmem-lever'><td>{escape(m.lever.name)}</td><td style='text-align:right;white-space:nowrap'>{peak}</td>"
                    f"<td style='color:{colour};vertical-align:top'>{escape(verdict)}</td><td>{escape(m.lever.cost.text)}</td>"
                    f"<td><code style='{CODE}'>{escape(m.change)}</code></td></tr>")
    setting = [f"{advice.batch_var} = {advice.batch}"] if advice.batch_var and advice.batch else []
    setting += [f"PYTORCH_CUDA_ALLOC_CONF={advice.alloc_conf}"] if advice.alloc_conf else []
    head = (f"<b>What would make it fit {escape(b.gpu_name)}</b> ({amount(b.capacity_bytes)}): the step as "
            f"written peaks at {amount(b.peak_device_bytes)}" + (f" ({escape(', '.join(setting))})" if setting else "")
            + "; each change below was applied to this step and estimated again")
    if advice.batch_var_inferred:
        head += (f" (the batch size is <code>{escape(str(advice.batch_var))}</code>, the one batch-size name the "
                 "cell assigns or passes to a call; <code>--batch-var</code> names another)")
    if b.fits:
        verdict = "The step fits already; the table shows what each change would save."
    elif advice.combination:
        code = "".join(f"<li>{escape(n)}: <code style='{CODE};display:block;box-sizing:border-box;max-width:100%'>"
                       f"{escape(_measured(advice, n).change)}</code></li>"
                       for n in advice.combination)
        verdict = (f"<b>Cheapest change that fits:</b> <span class='xmem-combination'>"
                   f"{escape(' + '.join(advice.combination))}</span> (peak {amount(advice.combination_peak_bytes or 0)})"
                   f"<ul>{code}</ul>")
    else:
        verdict = (f"<span style='color:{var('nofit')}'>No change or combination measured here makes it fit:"
                   "</span> a larger GPU, or sharding over several.")
    return (f"<div class='xmem-advice' style='{STYLE}'><div>{head}</div>"
            f"<table><caption style='text-align:left'>each change, cheapest first</caption><tr><th scope='col'>change"
            f"</th><th scope='col'>peak device memory</th><th scope='col'>verdict</th><th scope='col'>cost (extra compute first)</th>"
            f"<th scope='col'>how</th></tr>{''.join(rows)}</table>"
            f"<div class='xmem-ranking' style='color:{var('fg2')};font-size:12px'>{escape(RANKING)}</div>"
            f"<div>{verdict}</div></div>")


def _measured(advice: Advice, name: str) -> Measured:
    return next(m for m in advice.levers if m.lever.name == name)


def measured(advice: Advice) -> list[tuple[str, Estimate]]:
    """("as written", baseline) and each lever that has an estimate, in the table's order."""
    out = [("as written", advice.baseline)]
    out += [(m.lever.name, m.estimate) for m in advice.levers if m.estimate is not None and not m.error]
    return out


@dataclass
class Panel:
    """One small chart of :class:`LeverTimelines`."""

    name: str
    estimate: Estimate
    title: str  # "activation checkpointing: peak device memory 9.87 GiB, fits"
    svg: str


class LeverTimelines:
    """Each lever's allocator memory over its step, side by side on one y scale, as static
    HTML: inline SVG, saved in the notebook with its output, so it survives a page reload and
    a kernel restart (a widget would say "model not found"). Each panel's title says the peak
    and fits or not in words (and a mark), never only by colour; titles wrap, never cut; the
    x axis is labelled once per panel at its two ends; the legend is shared, under the grid.
    Colours follow JupyterLab's theme (``palette.stylesheet``)."""

    def __init__(self, panels: list[Panel], legend: str, limit_text: str):
        self.panels, self._legend, self.limit_text = panels, legend, limit_text

    def _repr_html_(self) -> str:
        cells = "".join(
            f"<figure class='xmem-lever-panel' style='margin:0;min-width:0'>"
            f"<figcaption style='font-size:12px;line-height:1.35;overflow-wrap:anywhere;"
            f"color:{var('fits' if p.estimate.fits else 'nofit')}'>{escape(p.title)}</figcaption>{p.svg}</figure>"
            for p in self.panels)
        return (f"<div class='xmem-lever-timelines' style='{STYLE};color:{var('fg')};max-width:100%'>"
                f"<style>{stylesheet()}</style>"
                f"<div style='display:grid;grid-template-columns:repeat(auto-fill,minmax(260px,1fr));gap:10px 16px'>"
                f"{cells}</div>{self._legend}</div>")

    def __repr__(self) -> str:
        return "\n".join(p.title for p in self.panels)


def lever_timelines(advice: Advice, names: list[str] | None = None, *, columns: int = 3, width: int = 900
                    ) -> LeverTimelines:
    """Each lever's allocator memory over its step, side by side on one y scale, with the GPU's
    allocator limit: static HTML to display (:class:`LeverTimelines`). ``names`` picks levers
    (default: all measured); ``columns`` and ``width`` are kept for old callers (the grid fits
    the page's width)."""
    chosen = [(n, e) for n, e in measured(advice) if names is None or n in names or n == "as written"]
    gib = float(1 << 30)
    limit = advice.baseline.allocator_limit_bytes
    top = 1.05 * max(max(limit, e.capacity_bytes, max(e.timeline.reserved, default=0)) for _, e in chosen) / gib
    panels = [Panel(n, e, _panel_title(n, e), _panel_svg(n, e, top, gib)) for n, e in chosen]
    limit_text = f"allocator limit {amount(limit)} ({escape(advice.baseline.gpu_name)})"
    key = lambda colour, dash, text: (  # noqa: E731
        f"<span style='display:inline-flex;align-items:center;gap:4px;margin-right:14px'>"
        f"<svg width='18' height='6' aria-hidden='true'><line x1='0' x2='18' y1='3' y2='3' stroke='{colour}' "
        f"stroke-width='2' stroke-dasharray='{dash}'/></svg>{text}</span>")
    legend = (f"<div class='xmem-lever-legend' style='font-size:12px;margin-top:4px'>"
              f"{key(var('allocated'), '', 'allocated')}{key(LINE_COLORS['reserved'], '', 'reserved')}"
              f"{key(var('limit'), '6 4', limit_text)}"
              f"<span>&#10004; fits, &#10008; does not fit (the title says which)</span></div>")
    return LeverTimelines(panels, legend, limit_text)


def _panel_title(name: str, est: Estimate) -> str:
    verdict = "fits" if est.fits else "does not fit"
    return f"{'✔' if est.fits else '✘'} {name}: peak device memory {amount(est.peak_device_bytes)}, {verdict}"


def _panel_svg(name: str, est: Estimate, top: float, gib: float) -> str:
    """One panel: reserved and allocated over the step, the allocator's limit dashed."""
    w, h, left, right, up, down = 300, 150, 44, 8, 6, 30
    pw, ph = w - left - right, h - up - down
    x, a, r = (np.asarray(v, dtype=np.int64) for v in (est.timeline.event, est.timeline.allocated,
                                                      est.timeline.reserved))
    keep = thin(x, a, r, 600) if len(x) else np.arange(0)
    x_end = max(int(x[-1]) if len(x) else 1, 1)
    X = lambda e: left + pw * e / x_end  # noqa: E731
    Y = lambda b: up + ph - ph * (b / gib) / top  # noqa: E731

    def steps(values: np.ndarray) -> str:
        pts, prev = [], None
        for e, v in zip(x[keep].tolist(), values[keep].tolist()):
            if prev is not None:
                pts.append(f"{X(e):.1f},{Y(prev):.1f}")
            pts.append(f"{X(e):.1f},{Y(v):.1f}")
            prev = v
        return " ".join(pts)

    ticks = "".join(
        f"<line x1='{left}' x2='{left + pw}' y1='{Y(t * gib):.1f}' y2='{Y(t * gib):.1f}' stroke='{var('grid')}'/>"
        f"<text x='{left - 4}' y='{Y(t * gib) + 4:.1f}' text-anchor='end' font-size='10' fill='{var('fg')}'>"
        f"{t:g}</text>" for t in _ticks(top))
    lim = Y(est.allocator_limit_bytes)
    label = escape(f"{_panel_title(name, est)}; reserved peak {amount(est.peak_reserved_bytes)}, allocated peak "
                   f"{amount(est.peak_allocated_bytes)}, allocator limit {amount(est.allocator_limit_bytes)}")
    return (f"<svg viewBox='0 0 {w} {h}' width='100%' role='img' aria-label='{label}' style='display:block'>"
            f"<title>{label}</title>{ticks}"
            f"<line x1='{left}' x2='{left + pw}' y1='{lim:.1f}' y2='{lim:.1f}' stroke='{var('limit')}' "
            f"stroke-width='1.5' stroke-dasharray='6 4'/>"
            f"<polyline points='{steps(r)}' fill='none' stroke='{LINE_COLORS['reserved']}' stroke-width='1.5'/>"
            f"<polyline points='{steps(a)}' fill='none' stroke='{var('allocated')}' stroke-width='1.5'/>"
            f"<text x='{left}' y='{h - 16}' font-size='10' fill='{var('fg')}'>0</text>"
            f"<text x='{left + pw}' y='{h - 16}' font-size='10' text-anchor='end' fill='{var('fg')}'>{x_end:,}</text>"
            f"<text x='{left + pw / 2:.1f}' y='{h - 3}' font-size='10' text-anchor='middle' fill='{var('fg')}'>"
            f"event</text><text x='10' y='{up + ph / 2:.1f}' font-size='10' text-anchor='middle' fill='{var('fg')}' "
            f"transform='rotate(-90 10 {up + ph / 2:.1f})'>GiB</text></svg>")


def _ticks(top: float) -> list[float]:
    """Four or five round values from 0 to below ``top`` (GiB)."""
    raw = top / 4
    mag = 10 ** np.floor(np.log10(raw)) if raw > 0 else 1
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [round(k * step, 6) for k in range(int(top / step) + 1)]
