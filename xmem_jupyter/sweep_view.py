"""A sweep's rows as a heat map: peak memory per GPU x batch size, with the fit boundary.

The question a sweep answers at a glance: which GPU, at which batch size. Each cell is one
row of :func:`xmem_engine.sweep.sweep` (or of its output file, read back as dicts): shaded by
its peak's share of the GPU's memory (light: little of it; dark: nearly all), red where it
does not fit, grey where the point failed; a red line runs between the cells that fit and
those that do not, and each GPU's label carries the largest value that fits when the sweep
searched for it (``--max-batch``). Colours come from :mod:`xmem_jupyter.palette`.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

from xmem_jupyter.palette import HEAT_COLORS, SWEEP_COLORS

GIB = 1 << 30


def _get(row: Any, name: str, default: Any = None) -> Any:
    """A field of a ``Row`` or of a dict read back from the output file."""
    if isinstance(row, Mapping):
        return row.get(name, default)
    return getattr(row, name, default)


def _settings(row: Any) -> dict[str, str]:
    s = _get(row, "settings")
    if isinstance(s, Mapping):
        return {k: str(v) for k, v in s.items()}
    return {k[4:]: str(v) for k, v in (row.items() if isinstance(row, Mapping) else ())
            if k.startswith("set:") and v not in (None, "")}


def _ordered(values: Iterable[str]) -> list[str]:
    """Numbers in numeric order, anything else as first met."""
    vals = list(dict.fromkeys(values))
    try:
        return sorted(vals, key=float)
    except ValueError:
        return vals


def heat_map_data(rows: Iterable[Any], *, script: str | None = None, var: str | None = None,
                  alloc_conf: str | None = None, where: dict[str, Any] | None = None) -> dict[str, Any]:
    """The cells of one heat map, chosen from ``rows``: one script (default: the first), one
    allocator setting (default: the first), ``var`` on the x axis (default: the ``--set``
    variable with the most values), the other variables fixed by ``where`` (default: the
    first value of each). Returns the columns Bokeh draws and the axes' factors."""
    rows = list(rows)
    points = [r for r in rows if _get(r, "kind") == "point"]
    if not points:
        raise ValueError("no estimated points in these rows")
    script = script if script is not None else _get(points[0], "script")
    alloc_conf = alloc_conf if alloc_conf is not None else _get(points[0], "alloc_conf")
    points = [r for r in points if _get(r, "script") == script and (_get(r, "alloc_conf") or "") == (alloc_conf or "")]
    if not points:
        raise ValueError(f"no points for script {script!r} with alloc_conf {alloc_conf!r}")
    values: dict[str, list[str]] = {}
    for r in points:
        for k, v in _settings(r).items():
            values.setdefault(k, [])
            if v not in values[k]:
                values[k].append(v)
    if var is None:
        if not values:
            raise ValueError("the sweep set no variable: nothing to put on the x axis")
        var = max(values, key=lambda k: len(values[k]))
    if var not in values:
        raise ValueError(f"the sweep did not set {var!r} (it set {', '.join(values) or 'nothing'})")
    fixed = {k: vs[0] for k, vs in values.items() if k != var}
    fixed.update({k: str(v) for k, v in (where or {}).items()})
    cells = [r for r in points if all(_settings(r).get(k) == v for k, v in fixed.items())]
    capacity = {_get(r, "gpu"): _get(r, "capacity_bytes") or 0 for r in cells}
    gpus = sorted(capacity, key=lambda g: (capacity[g], g))
    xs = _ordered(_settings(r)[var] for r in cells)
    searched = {_get(r, "gpu"): _get(r, "answer") for r in rows
                if _get(r, "kind") == "max_batch" and _get(r, "script") == script and _get(r, "status") == "ok"
                and _get(r, "variable") == var and (_get(r, "alloc_conf") or "") == (alloc_conf or "")
                and all(_settings(r).get(k) == v for k, v in fixed.items() if k != var)}
    cols: dict[str, list] = {k: [] for k in ("x", "y", "fill", "text", "text_color", "tip")}
    status: dict[tuple[int, int], bool | None] = {}
    for r in cells:
        gpu, x = _get(r, "gpu"), _settings(r)[var]
        ok = _get(r, "status") == "ok"
        peak, cap = _get(r, "peak_device_bytes") or 0, capacity[gpu] or 1
        share = peak / cap
        if not ok:
            fill, text = SWEEP_COLORS["failed"], "failed"
        elif not _get(r, "fits"):
            fill, text = SWEEP_COLORS["nofit"], f"{peak / GIB:.1f}"
        else:
            fill, text = HEAT_COLORS[min(len(HEAT_COLORS) - 1, int(share * len(HEAT_COLORS)))], f"{peak / GIB:.1f}"
        dark = ok and _get(r, "fits") and share > 0.55
        status[(xs.index(x), gpus.index(gpu))] = bool(_get(r, "fits")) if ok else None
        cols["x"].append(xs.index(x))
        cols["y"].append(gpus.index(gpu))
        cols["fill"].append(fill)
        cols["text"].append(text)
        cols["text_color"].append(SWEEP_COLORS["text_on_dark" if dark else "text"])
        cols["tip"].append(_tip(r, var, x, peak, cap, ok))
    return {"columns": cols, "xs": xs, "gpus": gpus, "var": var, "script": script, "alloc_conf": alloc_conf,
            "fixed": fixed, "boundary": _boundary(status), "searched": searched}


def _tip(r: Any, var: str, x: str, peak: int, cap: int, ok: bool) -> str:
    if not ok:
        return f"{_get(r, 'gpu')}, {var}={x}: failed: {_get(r, 'error')}"
    verdict = "fits" if _get(r, "fits") else "does not fit"
    return (f"{_get(r, 'gpu')}, {var}={x}: peak {peak / GIB:.2f} of {cap / GIB:.2f} GiB, {verdict} "
            f"(headroom {(_get(r, 'headroom_bytes') or 0) / GIB:.2f} GiB, {_get(r, 'mode')} mode)")


def _boundary(status: dict[tuple[int, int], bool | None]) -> dict[str, list[float]]:
    """The edges between a cell that fits and a neighbour that does not: the fit boundary
    (a staircase when memory grows with the batch, whatever the shape otherwise)."""
    seg: dict[str, list[float]] = {"x0": [], "y0": [], "x1": [], "y1": []}
    for (i, j), fits in status.items():
        for di, dj in ((1, 0), (0, 1)):
            other = status.get((i + di, j + dj))
            if fits is None or other is None or other == fits:
                continue
            if di:  # vertical edge between columns i and i + 1
                x0 = x1 = i + 0.5
                y0, y1 = j - 0.5, j + 0.5
            else:  # horizontal edge between rows j and j + 1
                y0 = y1 = j + 0.5
                x0, x1 = i - 0.5, i + 0.5
            for k, v in zip(("x0", "y0", "x1", "y1"), (x0, y0, x1, y1)):
                seg[k].append(v)
    return seg


def heat_map(rows: Iterable[Any], *, script: str | None = None, var: str | None = None,
             alloc_conf: str | None = None, where: dict[str, Any] | None = None, width: int = 720) -> Any:
    """A Bokeh figure of :func:`heat_map_data` (show it with ``bokeh.io.show``, save it with
    ``bokeh.io.save``, or in a notebook use :func:`sweep_view`)."""
    from bokeh.models import ColorBar, ColumnDataSource, HoverTool, LinearColorMapper, Title
    from bokeh.plotting import figure

    d = heat_map_data(rows, script=script, var=var, alloc_conf=alloc_conf, where=where)
    xs, gpus = d["xs"], d["gpus"]
    labels = {j: g + (f" (max {d['searched'][g]})" if g in d["searched"] else "") for j, g in enumerate(gpus)}
    fixed = ", ".join(f"{k}={v}" for k, v in d["fixed"].items())
    title = (f"{os.path.basename(str(d['script']))}: peak GPU memory (GiB) per GPU and {d['var']}"
             + (f" ({fixed})" if fixed else "") + (f" [{d['alloc_conf']}]" if d["alloc_conf"] else ""))
    fig = figure(width=width, height=90 + 42 * len(gpus), title=title, x_range=(-0.5, len(xs) - 0.5),
                 y_range=(-0.5, len(gpus) - 0.5), tools="save,reset", toolbar_location="above",
                 x_axis_label=d["var"])
    src = ColumnDataSource(d["columns"])
    cells = fig.rect(x="x", y="y", width=1, height=1, source=src, fill_color="fill",
                     line_color=SWEEP_COLORS["grid"], line_width=1)
    fig.text(x="x", y="y", text="text", source=src, text_align="center", text_baseline="middle",
             text_font_size="9pt", text_color="text_color")
    fig.segment(x0="x0", y0="y0", x1="x1", y1="y1", source=ColumnDataSource(d["boundary"]),
                line_color=SWEEP_COLORS["boundary"], line_width=3)
    fig.add_tools(HoverTool(renderers=[cells], tooltips="@tip"))
    fig.xaxis.ticker = list(range(len(xs)))
    fig.xaxis.major_label_overrides = {i: x for i, x in enumerate(xs)}
    fig.yaxis.ticker = list(range(len(gpus)))
    fig.yaxis.major_label_overrides = labels
    fig.xgrid.visible = fig.ygrid.visible = False
    fig.title.text_font_size = "10pt"
    mapper = LinearColorMapper(palette=list(HEAT_COLORS), low=0, high=1)
    fig.add_layout(ColorBar(color_mapper=mapper, title="share of the GPU's memory", title_text_font_size="8pt",
                            title_text_font_style="normal", width=10, padding=4), "right")
    fig.add_layout(Title(text="shaded: the peak's share of the GPU's memory; pink: does not fit; grey: the point "
                              "failed; red line: the fit boundary" + ("; (max N): the largest value that fits"
                                                                     if d["searched"] else ""),
                         text_font_style="normal", text_font_size="8pt"), "below")
    return fig


def sweep_view(rows: Iterable[Any], *, var: str | None = None, where: dict[str, Any] | None = None,
               width: int = 720) -> Any:
    """The heat maps of a sweep for a notebook, one per script and allocator setting, in the
    widget's way (inline BokehJS that survives a page reload)."""
    import ipywidgets as widgets
    from bokeh.layouts import column
    from jupyter_bokeh import BokehModel

    from xmem_jupyter.bokeh_loader import bokeh_loader

    rows = list(rows)
    pairs = list(dict.fromkeys((_get(r, "script"), _get(r, "alloc_conf") or "") for r in rows
                               if _get(r, "kind") == "point"))
    figs = [heat_map(rows, script=s, alloc_conf=c, var=var, where=where, width=width) for s, c in pairs]
    return widgets.VBox([bokeh_loader(), BokehModel(column(*figs))])
