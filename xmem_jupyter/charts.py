"""The Bokeh figures: the tensor-lifetime flame chart above the memory timeline.

Both share one x range (zoom or pan one, the other follows), so they live in one Bokeh
layout inside one ``jupyter_bokeh.BokehModel``. Updates (GPU switch, allocator toggle) change
the data sources in place; :class:`Charts` keeps the models it changes.

Legibility: the charts take the width of the output (``stretch_width``, down to
``MIN_WIDTH``); legends sit outside the plots; the GPU's capacity (solid red) and the
allocator's limit (dashed amber) differ in colour and dash, and the legend gives each its
figure; the out-of-memory mark is labelled at the top of the plot, clear of the lines. Colours
follow JupyterLab's theme: each model reads them from CSS custom properties (``themed``:
Bokeh's ``--bk-*`` variables set to ``palette.var``), which the widget's stylesheet sets per
theme. Every figure named in a label comes from :mod:`xmem_jupyter.figures`.
"""

from __future__ import annotations

from dataclasses import dataclass

from bokeh.layouts import column
from bokeh.models import (BoxAnnotation, ColumnDataSource, HoverTool, Label, Legend, LegendItem, Range1d,
                          Span, Title)
from bokeh.plotting import figure

from xmem_jupyter.flame import DRAWN, FlameData
from xmem_jupyter.palette import CATEGORY_COLORS, CATEGORY_ORDER, LINE_COLORS, PHASE_COLORS, THEMED, var
from xmem_jupyter.timeline import TimelineData
from bokeh.transform import linear_cmap

FLAME_TOOLTIPS = "<div style='font-size:11px;max-width:30em'>@tip{safe}</div>"
MIN_WIDTH = 420  # px: below this the charts scroll rather than squeeze

FG, FG2, BG, GRID = var("fg"), var("fg2"), var("bg"), var("grid")


def css(model, variables: dict[str, str]):
    """Give a Bokeh model CSS custom properties (``--bk-*`` overrides of its colours), as a
    ``:host`` rule of its own stylesheet. (``css_variables`` would be the property for it, but
    BokehJS 3.9 joins several into one invalid rule: only the first would apply.)"""
    decls = ";".join(f"{k}:{v}" for k, v in variables.items())
    model.stylesheets = [*model.stylesheets, f":host{{{decls}}}"]
    return model


def themed(fig) -> None:
    """Point a figure's backgrounds, text, axes, grid and legends at the theme's colours."""
    css(fig, {"--bk-background-fill-color": BG, "--bk-border-fill-color": BG, "--bk-outline-line-color": GRID})
    for t in [fig.title, *fig.above, *fig.below]:
        if isinstance(t, Title):
            css(t, {"--bk-text-color": FG2 if t is not fig.title else FG, "--bk-background-fill-color": "transparent"})
    for ax in fig.axis:
        css(ax, {"--bk-axis-label-text-color": FG, "--bk-major-label-text-color": FG, "--bk-axis-line-color": FG2,
                 "--bk-major-tick-line-color": FG2, "--bk-minor-tick-line-color": FG2})
    for g in fig.grid:
        css(g, {"--bk-grid-line-color": GRID})
    for lg in fig.legend:  # drawn in HTML, with colours it computes once: restyled in CSS
        lg.stylesheets = [*lg.stylesheets, f":host{{--background-color:{BG} !important;background-color:{BG} !important;"
                                           f"border-color:{GRID} !important}}"
                                           f".bk-item .bk-label,.bk-title{{color:{FG} !important}}"]
    css(fig.toolbar, {"--icon-color": FG2})


def mark(model, colour: str, label: bool = False):
    """Draw a line (or a label's text) in a themed colour (palette.THEMED)."""
    if label:
        return css(model, {"--bk-text-color": var(colour), "--bk-background-fill-color": BG})
    return css(model, {"--bk-line-color": var(colour)})


@dataclass
class Charts:
    """The layout and the models an update touches."""

    layout: object
    flame_source: ColumnDataSource
    line_source: ColumnDataSource
    limits: ColumnDataSource  # y of the GPU's capacity and of the allocator's limit (hspan glyphs)
    peak_flame: Span
    peak_line: Span
    timeline_fig: object
    oom: Span
    oom_label: Label
    peak_label: Label
    legend_items: dict[str, LegendItem]
    step_label: Label | None = None  # "step 2 starts": where the first step ends (None: one step)
    shape: tuple = ()  # chart_shape() of what it draws: data of the same shape is updated in place
    flame_fig: object = None

    def takes(self, fl: FlameData, tl: TimelineData) -> bool:
        """Whether ``fl`` and ``tl`` can replace the data drawn, models kept: the same events at
        the same places (phases, iterations, tensors, categories), only sizes differ, as in
        another GPU's estimate or another batch size's trace from the batch family."""
        return chart_shape(fl, tl) == self.shape

    def update_timeline(self, tl: TimelineData) -> None:
        """New allocated/reserved lines and limits (a GPU or allocator change)."""
        self.line_source.data = tl.columns
        self.limits.data = _limits(tl)
        self.peak_line.location = tl.peak_x
        self.peak_flame.location = tl.peak_x
        self.timeline_fig.y_range.end = tl.top
        self.timeline_fig.yaxis.axis_label = tl.unit
        self.timeline_fig.title.text = timeline_title(tl)
        for key, text in legend_labels(tl).items():
            self.legend_items[key].label = {"value": text}
        self.peak_label.text = tl.labels["allocated_peak"]
        _place_oom(self.oom, self.oom_label, tl)

    def update_flame(self, fl: FlameData) -> None:
        self.flame_source.data = {c: fl.columns[c] for c in DRAWN}
        self.peak_label.x, self.peak_label.y = fl.peak_x, fl.peak_bytes / fl.scale
        self.flame_fig.yaxis.axis_label = f"live memory ({fl.unit})"


def chart_shape(fl: FlameData, tl: TimelineData) -> tuple:
    """What fixes the charts' models (not their data): see :meth:`Charts.takes`."""
    return (fl.x_end, fl.n_tensors, tuple(sorted(set(fl.columns["category"]))), tuple(tl.phases),
            tuple(tl.iterations))


def build_charts(fl: FlameData, tl: TimelineData, width: int = 900) -> Charts:
    """Flame chart (tensors as bars, coloured by category) over the timeline, x linked.
    ``width`` is the widest they grow; they fit narrower outputs down to ``MIN_WIDTH``."""
    x_range = Range1d(0, fl.x_end, bounds=(0, fl.x_end))
    tools = "xpan,xwheel_zoom,box_zoom,reset,save"
    size = dict(sizing_mode="stretch_width", min_width=MIN_WIDTH, max_width=width)
    flame = figure(height=340, x_range=x_range, tools=tools, active_scroll="xwheel_zoom",
                   title=f"Tensor lifetimes: {fl.n_tensors:,} tensors; height = live memory",
                   y_axis_label=f"live memory ({fl.unit})", toolbar_location="above", **size)
    flame.xaxis.visible = False
    # room above the stack for the peak's label (it sits above the bars, not under them)
    flame.y_range.start, flame.y_range.range_padding = 0, 0.15
    flame.add_layout(Title(text="shading: forward (green), backward (orange), optimizer (purple); dotted: "
                                "iterations; dashed: the allocated peak; hover a bar for the tensor",
                           text_font_style="normal", text_font_size="8pt"), "above")
    _phases(flame, tl)
    src = ColumnDataSource({c: fl.columns[c] for c in DRAWN})
    quads = flame.quad(left="left", right="right", bottom="bottom", top="top", source=src,
                       fill_color=linear_cmap("cat", [CATEGORY_COLORS[c] for c in CATEGORY_ORDER], 0,
                                              len(CATEGORY_ORDER) - 1),
                       line_color=None, fill_alpha=0.85, hover_fill_alpha=1.0, hover_line_color="black")
    flame.add_tools(HoverTool(renderers=[quads], tooltips=FLAME_TOOLTIPS))
    present = sorted(set(fl.columns["category"]), key=CATEGORY_ORDER.index)
    legend_src = [flame.scatter(x=[0], y=[0], marker="square", size=0, color=CATEGORY_COLORS[c]) for c in present]
    flame.add_layout(Legend(items=[LegendItem(label=c, renderers=[r]) for c, r in zip(present, legend_src)],
                            location="top_left", orientation="horizontal", label_text_font_size="8pt",
                            border_line_alpha=0), "above")
    peak_flame = mark(Span(location=tl.peak_x, dimension="height", line_color=THEMED["peak"][0], line_width=2,
                           line_dash="dashed"), "peak")
    flame.add_layout(peak_flame)
    # above the bars, on the page's ground: a label inside the stack is hidden by the bars
    peak_label = mark(Label(x=fl.peak_x, y=fl.peak_bytes / fl.scale, text=tl.labels["allocated_peak"],
                            text_color=THEMED["peak"][0], text_font_size="9pt", x_offset=4, y_offset=4,
                            background_fill_color="white", background_fill_alpha=0.85), "peak", label=True)
    flame.add_layout(peak_label)

    line = figure(height=300, x_range=x_range, y_range=Range1d(0, tl.top), tools=tools,
                  active_scroll="xwheel_zoom", title=timeline_title(tl), y_axis_label=tl.unit,
                  x_axis_label="event (allocations and frees, in program order)", toolbar_location=None, **size)
    _phases(line, tl)
    lsrc = ColumnDataSource(tl.columns)
    reserved = line.step("x", "reserved", source=lsrc, mode="after", color=LINE_COLORS["reserved"], line_width=2)
    allocated = line.step("x", "allocated", source=lsrc, mode="after", color=THEMED["allocated"][0], line_width=2)
    mark(allocated, "allocated")
    limits = ColumnDataSource(_limits(tl))
    band = line.hstrip(y0="range_low", y1="range_high", source=limits, fill_color=LINE_COLORS["reserved"],
                       fill_alpha=0.25, line_alpha=0)
    capacity = line.hspan(y="capacity", source=limits, line_color=THEMED["capacity"][0], line_width=2.5)
    mark(capacity, "capacity")
    limit = line.hspan(y="limit", source=limits, line_color=THEMED["limit"][0], line_dash=[6, 4], line_width=2)
    mark(limit, "limit")
    labels = legend_labels(tl)
    items = {k: LegendItem(label=labels[k], renderers=[r]) for k, r in (
        ("reserved", reserved), ("allocated", allocated), ("range", band), ("capacity", capacity), ("limit", limit))}
    line.add_layout(Legend(items=list(items.values()), orientation="horizontal", label_text_font_size="8pt",
                           location="top_left", border_line_alpha=0, nrows=2), "below")
    peak_line = mark(Span(location=tl.peak_x, dimension="height", line_color=THEMED["peak"][0], line_dash="dashed"),
                     "peak")
    oom = mark(Span(location=0, dimension="height", line_color=THEMED["oom"][0], line_width=3), "oom")
    # at the top of the plot, right of the mark: clear of the legend (outside) and the limits' lines
    oom_label = mark(Label(x=0, y=0, text="out of memory here", text_color=THEMED["oom"][0],
                           text_font_size="9pt", x_offset=5, text_baseline="top", background_fill_color="white",
                           background_fill_alpha=0.85), "oom", label=True)
    for s in (peak_line, oom, oom_label):
        line.add_layout(s)
    step_label = None
    if len(tl.iterations) >= 2:  # the first step's end, where a loop's steady state begins
        step_label = css(Label(x=tl.iterations[1], y=0, text=f"step 2 of {len(tl.iterations)} starts",
                               text_color="#444", text_font_size="8pt", x_offset=3, y_offset=3,
                               text_baseline="bottom", background_fill_color="white", background_fill_alpha=0.85),
                         {"--bk-text-color": FG2, "--bk-background-fill-color": BG})
        line.add_layout(step_label)
    _place_oom(oom, oom_label, tl)
    line.add_tools(HoverTool(tooltips=[("event", "@x"), ("allocated", "@allocated{0.00}"),
                                       ("reserved", "@reserved{0.00}")], mode="vline", renderers=[allocated]))
    for f in (flame, line):
        themed(f)
    layout = column(flame, line, sizing_mode="stretch_width", min_width=MIN_WIDTH, max_width=width)
    return Charts(layout, src, lsrc, limits, peak_flame, peak_line, line, oom, oom_label, peak_label, items,
                  step_label, chart_shape(fl, tl), flame)


def legend_labels(tl: TimelineData) -> dict[str, str]:
    """The timeline legend: each line named as everywhere else, with its figure."""
    return {"reserved": f"reserved ({tl.labels['reserved_peak']})",
            "allocated": f"allocated ({tl.labels['allocated_peak']})",
            "range": "calibrated range of the reserved peak",
            "capacity": tl.labels["capacity"], "limit": tl.labels["allocator_limit"]}


def _limits(tl: TimelineData) -> dict[str, list[float]]:
    return {"capacity": [tl.capacity], "limit": [tl.allocator_limit], "range_low": [tl.range_low],
            "range_high": [tl.range_high]}


def _place_oom(oom: Span, label: Label, tl: TimelineData) -> None:
    """The out-of-memory mark at the failing event, labelled at the top of the plot, or hidden."""
    oom.visible = label.visible = tl.oom_x is not None
    if tl.oom_x is not None:
        oom.location = label.x = tl.oom_x
        label.y = tl.top * 0.98
        label.text = f"out of memory here (event {tl.oom_x:,})"


def timeline_title(tl: TimelineData) -> str:
    """Short enough not to be cut at the narrowest width: the figures are in the legend."""
    return f"Allocator memory over the step ({tl.unit})"


def _phases(fig: object, tl: TimelineData) -> None:
    """Shade forward / backward / optimizer; a dotted line where each iteration starts."""
    for x0, x1, name in tl.phases:
        if name in ("forward", "backward", "optimizer"):
            fig.add_layout(BoxAnnotation(left=x0, right=x1, fill_color=PHASE_COLORS[name], fill_alpha=0.07,
                                         line_alpha=0))
    for k, x in enumerate(tl.iterations):
        fig.add_layout(css(Span(location=x, dimension="height", line_color="#444", line_dash="dotted", line_width=1),
                           {"--bk-line-color": FG2}))
