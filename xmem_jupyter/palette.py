"""The colours of every xmem view, defined once.

The widget's Bokeh charts, its HTML verdict and breakdown, the static HTML summary, and the
saved report that the lab extension draws (it reads :func:`palette` from the report's
``palette`` field) all take their colours from here, so a category, a phase or a line looks
the same wherever a user meets it.
"""

from __future__ import annotations

#: the order categories are stacked and listed in
CATEGORY_ORDER = ("parameter", "buffer", "optimizer_state", "gradient", "input", "activation",
                  "temporary", "workspace", "communication", "other")
CATEGORY_COLORS = {  # in CATEGORY_ORDER (matplotlib's tab10/tab20)
    "parameter": "#1f77b4",
    "buffer": "#aec7e8",
    "optimizer_state": "#9467bd",
    "gradient": "#ff7f0e",
    "input": "#8c564b",
    "activation": "#2ca02c",
    "temporary": "#d62728",
    "workspace": "#7f7f7f",
    "communication": "#17becf",
    "other": "#bcbd22",
}
#: the training phases, drawn as light bands behind the timelines
PHASE_COLORS = {"forward": "#2ca02c", "backward": "#ff7f0e", "optimizer": "#9467bd"}
#: the device bar: what the GPU's memory holds at the peak
DEVICE_COLORS = {"context": "#6e7781", "libraries": "#a0a0a0", "allocated": "#0969da", "cached": "#80b3ff"}
#: the memory timeline's lines and marks
LINE_COLORS = {"allocated": "#0969da", "reserved": "#80b3ff", "capacity": "#cf222e", "peak": "#cf222e",
               "oom": "#8b0000"}
FITS_COLOR, NOFIT_COLOR = "#1a7f37", "#cf222e"


def palette() -> dict[str, dict[str, str]]:
    """The colours as the saved report carries them (``report.schema.json``, ``palette``)."""
    return {"categories": dict(CATEGORY_COLORS), "phases": dict(PHASE_COLORS), "device": dict(DEVICE_COLORS),
            "lines": dict(LINE_COLORS), "verdict": {"fits": FITS_COLOR, "nofit": NOFIT_COLOR}}


#: the sweep heat map (sweep_view.py): a cell's peak as a share of its GPU's memory, light (little)
#: to dark (nearly full): matplotlib's Blues
HEAT_COLORS = ("#f7fbff", "#deebf7", "#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b")
#: its other marks: cells that do not fit or failed, the fit boundary, the cells' text
SWEEP_COLORS = {"nofit": "#ffc1c0", "failed": "#d0d7de", "boundary": "#cf222e", "text": "#1f2328",
                "text_on_dark": "#ffffff", "grid": "#ffffff"}
