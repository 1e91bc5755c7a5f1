"""What would make it fit, for a ``%%xmem`` cell: the advisor's levers measured on the cell.

:func:`advise_cell` runs :func:`xmem_engine.advisor.measure` with the cell as the step: each
lever's patches are in place while the cell is traced again in a copy of the namespace (the
cell's own traces and the user's variables stay as they were). :func:`advice_html` is the
panel the widget and the saved report show; :func:`lever_timelines` draws each lever's memory
timeline side by side on one scale, for teaching.
"""

from __future__ import annotations

from html import escape
from typing import Callable

import numpy as np

from xmem_engine.advisor import Advice, Lever, Measured, applied, measure
from xmem_engine.estimate import Estimate, estimate_trace, resolve_gpu

from xmem_jupyter.flame import human
from xmem_jupyter.palette import FITS_COLOR, LINE_COLORS, NOFIT_COLOR
from xmem_jupyter.session import Session
from xmem_jupyter.timeline import thin

STYLE = "font-family:var(--jp-ui-font-family,system-ui,sans-serif);font-size:13px;line-height:1.45"


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
                   base=base, progress=progress)


def advice_html(advice: Advice) -> str:
    """The levers as a table (cheapest first: measured peak, fits or not, cost, the change to
    make) and the cheapest change that fits, with its code."""
    b = advice.baseline
    rows = []
    for m in advice.levers:
        if m.error:
            peak, verdict, colour = "", f"not measured: {m.error}", "inherit"
        elif not m.applicable:
            peak, verdict, colour = "", f"n/a: {m.detail}", "inherit"
        else:
            peak = human(m.peak_device_bytes)
            verdict = ("fits" if m.fits else "does not fit") + (f" ({m.detail})" if m.detail else "")
            colour = FITS_COLOR if m.fits else NOFIT_COLOR
        rows.append(f"<tr class='xmem-lever'><td>{escape(m.lever.name)}</td><td style='text-align:right;white-space:nowrap'>{peak}</td>"
                    f"<td style='color:{colour};vertical-align:top'>{escape(verdict)}</td><td>{escape(m.lever.cost)}</td>"
                    f"<td><code>{escape(m.change)}</code></td></tr>")
    setting = [f"{advice.batch_var} = {advice.batch}"] if advice.batch_var and advice.batch else []
    setting += [f"PYTORCH_CUDA_ALLOC_CONF={advice.alloc_conf}"] if advice.alloc_conf else []
    head = (f"<b>What would make it fit {escape(b.gpu_name)}</b> ({human(b.capacity_bytes)}): the step as "
            f"written peaks at {human(b.peak_device_bytes)}" + (f" ({escape(', '.join(setting))})" if setting else "")
            + "; each change below was applied to this step and estimated again")
    if advice.batch_var_inferred:
        head += (f" (the batch size is <code>{escape(str(advice.batch_var))}</code>, the one batch-size name the "
                 "cell assigns; <code>--batch-var</code> names another)")
    if b.fits:
        verdict = "The step fits already; the table shows what each change would save."
    elif advice.combination:
        code = "".join(f"<li>{escape(n)}: <code>{escape(_measured(advice, n).change)}</code></li>"
                       for n in advice.combination)
        verdict = (f"<b>Cheapest change that fits:</b> <span class='xmem-combination'>"
                   f"{escape(' + '.join(advice.combination))}</span> (peak {human(advice.combination_peak_bytes or 0)})"
                   f"<ul>{code}</ul>")
    else:
        verdict = ("<span style='color:" + NOFIT_COLOR + "'>No change or combination measured here makes it fit:"
                   "</span> a larger GPU, or sharding over several.")
    return (f"<div class='xmem-advice' style='{STYLE}'><div>{head}</div>"
            f"<table><tr><th>change</th><th>peak</th><th></th><th>cost</th><th>how</th></tr>{''.join(rows)}</table>"
            f"<div>{verdict}</div></div>")


def _measured(advice: Advice, name: str) -> Measured:
    return next(m for m in advice.levers if m.lever.name == name)


def measured(advice: Advice) -> list[tuple[str, Estimate]]:
    """("as written", baseline) and each lever that has an estimate, in the table's order."""
    out = [("as written", advice.baseline)]
    out += [(m.lever.name, m.estimate) for m in advice.levers if m.estimate is not None and not m.error]
    return out


def lever_timelines(advice: Advice, names: list[str] | None = None, *, columns: int = 3, width: int = 900):
    """Each lever's allocator memory over its step, side by side on one y scale, with the GPU's
    capacity: a widget (``jupyter_bokeh.BokehModel``) to display. ``names`` picks levers
    (default: all measured)."""
    from bokeh.layouts import gridplot
    from bokeh.models import Range1d, Span
    from bokeh.plotting import figure
    from jupyter_bokeh import BokehModel

    chosen = [(n, e) for n, e in measured(advice) if names is None or n in names or n == "as written"]
    gib = float(1 << 30)
    top = 1.05 * max(max(e.capacity_bytes, max(e.timeline.reserved, default=0)) for _, e in chosen) / gib
    figs = []
    for name, est in chosen:
        colour = FITS_COLOR if est.fits else NOFIT_COLOR
        fig = figure(width=width // columns, height=180, y_range=Range1d(0, top), toolbar_location=None,
                     title=f"{name}: {human(est.peak_device_bytes)}", x_axis_label="event", y_axis_label="GiB")
        fig.title.text_color = colour
        x, a, r = (np.asarray(v, dtype=np.int64) for v in (est.timeline.event, est.timeline.allocated,
                                                          est.timeline.reserved))
        keep = thin(x, a, r, 1500)
        fig.step(x[keep], r[keep] / gib, mode="after", color=LINE_COLORS["reserved"], line_width=2,
                 legend_label="reserved")
        fig.step(x[keep], a[keep] / gib, mode="after", color=LINE_COLORS["allocated"], line_width=2,
                 legend_label="allocated")
        fig.legend.location, fig.legend.label_text_font_size = "top_left", "7pt"
        # what the allocator may reserve on this GPU: the reserved line must stay below it
        fig.add_layout(Span(location=est.allocator_limit_bytes / gib, dimension="width",
                            line_color=LINE_COLORS["capacity"], line_dash="dotted"))
        figs.append(fig)
    return BokehModel(gridplot(figs, ncols=columns))
