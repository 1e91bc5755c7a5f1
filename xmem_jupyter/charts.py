"""The Bokeh figures: the tensor-lifetime flame chart above the memory timeline.

Both share one x range (zoom or pan one, the other follows), so they live in one Bokeh
layout inside one ``jupyter_bokeh.BokehModel``. Updates (GPU switch, allocator toggle) change
the data sources in place; :class:`Charts` keeps the models it changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from bokeh.layouts import column
from bokeh.models import (BoxAnnotation, ColumnDataSource, HoverTool, Label, Legend, LegendItem, Range1d,
                          Span, Title)
from bokeh.plotting import figure
from bokeh.transform import linear_cmap

from xmem_jupyter.flame import DRAWN, FlameData
from xmem_jupyter.palette import CATEGORY_COLORS, CATEGORY_ORDER, LINE_COLORS, PHASE_COLORS
from xmem_jupyter.timeline import TimelineData

FLAME_TOOLTIPS = "<div style='font-size:11px;max-width:30em'>@tip{safe}</div>"


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

    def update_timeline(self, tl: TimelineData) -> None:
        """New allocated/reserved lines and limits (a GPU or allocator change)."""
        self.line_source.data = tl.columns
        self.limits.data = _limits(tl)
        self.peak_line.location = tl.peak_x
        self.peak_flame.location = tl.peak_x
        self.timeline_fig.y_range.end = tl.top
        self.timeline_fig.yaxis.axis_label = tl.unit
        self.timeline_fig.title.text = timeline_title(tl)
        _place_oom(self.oom, self.oom_label, tl)

    def update_flame(self, fl: FlameData) -> None:
        self.flame_source.data = {c: fl.columns[c] for c in DRAWN}


def build_charts(fl: FlameData, tl: TimelineData, width: int = 900) -> Charts:
    """Flame chart (tensors as bars, coloured by category) over the timeline, x linked."""
    x_range = Range1d(0, fl.x_end, bounds=(0, fl.x_end))
    tools = "xpan,xwheel_zoom,box_zoom,reset,save"
    flame = figure(height=340, width=width, x_range=x_range, tools=tools, active_scroll="xwheel_zoom",
                   title=f"Tensor lifetimes: {fl.n_tensors:,} tensors; height = live memory",
                   y_axis_label=f"live memory ({fl.unit})", toolbar_location="above")
    flame.xaxis.visible = False
    # room above the stack for the "peak" label (it sits above the bars, not under them)
    flame.y_range.start, flame.y_range.range_padding = 0, 0.15
    flame.add_layout(Title(text="shading: forward (green), backward (orange), optimizer (purple); dotted: "
                                "iterations; dashed red: the peak; hover a bar for the tensor",
                           text_font_style="normal", text_font_size="8pt", text_color="#555"), "above")
    _phases(flame, tl)
    src = ColumnDataSource({c: fl.columns[c] for c in DRAWN})
    quads = flame.quad(left="left", right="right", bottom="bottom", top="top", source=src, fill_color=linear_cmap("cat", [CATEGORY_COLORS[c] for c in CATEGORY_ORDER], 0, len(CATEGORY_ORDER) - 1),
                       line_color=None, fill_alpha=0.85, hover_fill_alpha=1.0, hover_line_color="black")
    flame.add_tools(HoverTool(renderers=[quads], tooltips=FLAME_TOOLTIPS))
    present = sorted(set(fl.columns["category"]), key=CATEGORY_ORDER.index)
    legend_src = [flame.scatter(x=[0], y=[0], marker="square", size=0, color=CATEGORY_COLORS[c]) for c in present]
    flame.add_layout(Legend(items=[LegendItem(label=c, renderers=[r]) for c, r in zip(present, legend_src)],
                            location="top_left", orientation="horizontal", label_text_font_size="8pt",
                            background_fill_alpha=0.6), "above")
    peak_flame = Span(location=tl.peak_x, dimension="height", line_color=LINE_COLORS["peak"], line_width=2,
                      line_dash="dashed")
    flame.add_layout(peak_flame)
    # above the bars, on a white ground: a label inside the stack is hidden by the bars
    flame.add_layout(Label(x=fl.peak_x, y=fl.peak_bytes / fl.scale, text="peak", text_color=LINE_COLORS["peak"],
                           text_font_size="9pt", x_offset=4, y_offset=4, background_fill_color="white",
                           background_fill_alpha=0.8))

    line = figure(height=200, width=width, x_range=x_range, y_range=Range1d(0, tl.top), tools=tools,
                  active_scroll="xwheel_zoom",
                  title="Allocator memory over the step", y_axis_label=tl.unit,
                  x_axis_label="event (allocations and frees, in program order)", toolbar_location=None)
    _phases(line, tl)
    lsrc = ColumnDataSource(tl.columns)
    line.step("x", "reserved", source=lsrc, mode="after", color=LINE_COLORS["reserved"], line_width=2, legend_label="reserved")
    line.step("x", "allocated", source=lsrc, mode="after", color=LINE_COLORS["allocated"], line_width=2, legend_label="allocated")
    limits = ColumnDataSource(_limits(tl))
    line.hstrip(y0="range_low", y1="range_high", source=limits, fill_color=LINE_COLORS["reserved"], fill_alpha=0.25,
                line_alpha=0, legend_label="calibrated range of the reserved peak")
    line.hspan(y="capacity", source=limits, line_color=LINE_COLORS["capacity"], line_width=2, legend_label="GPU capacity")
    line.hspan(y="limit", source=limits, line_color=LINE_COLORS["capacity"], line_dash="dotted", line_width=1.5,
               legend_label="allocator limit")
    peak_line = Span(location=tl.peak_x, dimension="height", line_color=LINE_COLORS["peak"], line_dash="dashed")
    oom = Span(location=0, dimension="height", line_color=LINE_COLORS["oom"], line_width=3)
    oom_label = Label(x=0, y=0, text="out of memory here", text_color=LINE_COLORS["oom"], text_font_size="9pt",
                      x_offset=4, y_offset=4, background_fill_color="white", background_fill_alpha=0.8)
    for s in (peak_line, oom, oom_label):
        line.add_layout(s)
    _place_oom(oom, oom_label, tl)
    line.title.text = timeline_title(tl)
    line.legend.location = "top_left"
    line.legend.label_text_font_size = "8pt"
    line.legend.background_fill_alpha = 0.6
    line.add_tools(HoverTool(tooltips=[("event", "@x"), ("allocated", "@allocated{0.00}"),
                                       ("reserved", "@reserved{0.00}")], mode="vline"))
    return Charts(column(flame, line), src, lsrc, limits, peak_flame, peak_line, line, oom, oom_label)


def _limits(tl: TimelineData) -> dict[str, list[float]]:
    return {"capacity": [tl.capacity], "limit": [tl.allocator_limit], "range_low": [tl.range_low],
            "range_high": [tl.range_high]}


def _place_oom(oom: Span, label: Label, tl: TimelineData) -> None:
    """The out-of-memory mark at the failing event, or hidden."""
    oom.visible = label.visible = tl.oom_x is not None
    if tl.oom_x is not None:
        oom.location = label.x = tl.oom_x
        label.y = tl.allocator_limit


def timeline_title(tl: TimelineData) -> str:
    """Short enough not to be cut: the limits' figures, in the axis's unit."""
    return f"Allocator memory ({tl.unit}): GPU {tl.capacity:,.2f}, allocator limit {tl.allocator_limit:,.2f}"


def _phases(fig: object, tl: TimelineData) -> None:
    """Shade forward / backward / optimizer; a dashed line where each iteration starts."""
    for x0, x1, name in tl.phases:
        if name in ("forward", "backward", "optimizer"):
            fig.add_layout(BoxAnnotation(left=x0, right=x1, fill_color=PHASE_COLORS[name], fill_alpha=0.07,
                                         line_alpha=0))
    for k, x in enumerate(tl.iterations):
        fig.add_layout(Span(location=x, dimension="height", line_color="#444", line_dash="dotted", line_width=1))
