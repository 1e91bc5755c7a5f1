"""The colours of every xmem view, defined once.

The widget's Bokeh charts, its HTML verdict and breakdown, the static HTML summary, and the
saved report that the lab extension draws (it reads :func:`palette` from the report's
``palette`` field) all take their colours from here, so a category, a phase or a line looks
the same wherever a user meets it.

Text and marks that must read on the page's background come in two shades (:data:`THEMED`):
one for a light theme, one for a dark one, each at least 4.5:1 against its theme's
backgrounds (``tests/jupyter/test_jupyter_widget.py`` computes the ratios). The widget, its charts and
the saved report pick the shade through CSS custom properties (:func:`stylesheet`,
``--xmem-*``) that follow JupyterLab's theme (``body[data-jp-theme-light]``); Bokeh reads them
for the canvas through its own ``--bk-*`` variables (``charts.themed``). The lab extension
loads the same rules (``labextension/style/palette.css``, written by ``python -m
xmem_jupyter.palette``) so they are in the page before any chart paints; the widget carries
them too, for other front ends.
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

#: (light theme, dark theme) shades of what is read as text or as a thin mark on the page
THEMED = {
    "fits": (FITS_COLOR, "#3fb950"),
    "nofit": (NOFIT_COLOR, "#ff7b72"),
    "capacity": (LINE_COLORS["capacity"], "#ff7b72"),  # the GPU's capacity: solid red
    "limit": ("#9a6700", "#d29922"),  # the allocator's limit: dashed amber, never the capacity's red
    "peak": (LINE_COLORS["peak"], "#ff7b72"),
    "oom": (LINE_COLORS["oom"], "#ffa198"),
    "allocated": (LINE_COLORS["allocated"], "#58a6ff"),
}
#: the backgrounds the shades are checked against: white and GitHub's light grey; JupyterLab
#: Dark's notebook (#111111) and panels (#212121)
THEME_BACKGROUNDS = {"light": ("#ffffff", "#f6f8fa"), "dark": ("#111111", "#212121")}
#: text, muted text, grid and background, from JupyterLab's theme where there is one
THEME_BASE = {
    "bg": "var(--jp-layout-color0, #ffffff)",
    "fg": "var(--jp-ui-font-color1, rgba(0, 0, 0, 0.87))",
    "fg2": "var(--jp-ui-font-color2, rgba(0, 0, 0, 0.54))",
    "grid": "var(--jp-border-color2, #e0e0e0)",
    "border": "var(--jp-border-color1, #bdbdbd)",
    "focus": "var(--jp-brand-color1, #1976d2)",
}
#: what marks JupyterLab's (and Notebook 7's, VS Code's) dark themes on the page
DARK_SELECTORS = ('body[data-jp-theme-light="false"]', "body.vscode-dark", "body.vscode-high-contrast")


def var(name: str) -> str:
    """A themed colour as CSS (``var(--xmem-NAME, light shade)``), for inline styles and Bokeh."""
    if name in THEMED:
        return f"var(--xmem-{name}, {THEMED[name][0]})"
    return f"var(--xmem-{name}, {THEME_BASE[name]})"


def stylesheet(scope: str = ".xmem-widget, .xmem-report, .xmem-lever-timelines") -> str:
    """The ``--xmem-*`` custom properties, light by default and dark under a dark theme."""
    light = "".join(f"--xmem-{k}:{v[0]};" for k, v in THEMED.items())
    dark = "".join(f"--xmem-{k}:{v[1]};" for k, v in THEMED.items())
    base = "".join(f"--xmem-{k}:{v};" for k, v in THEME_BASE.items())
    dark_scope = ", ".join(f"{d} {s.strip()}" for d in DARK_SELECTORS for s in scope.split(","))
    return f"{scope}{{{base}{light}}}\n{dark_scope}{{{dark}}}"


def palette() -> dict[str, dict[str, str]]:
    """The colours as the saved report carries them (``report.schema.json``, ``palette``);
    ``dark`` holds the dark theme's shades of :data:`THEMED`."""
    return {"categories": dict(CATEGORY_COLORS), "phases": dict(PHASE_COLORS), "device": dict(DEVICE_COLORS),
            "lines": {**LINE_COLORS, "limit": THEMED["limit"][0]}, "verdict": {"fits": FITS_COLOR, "nofit": NOFIT_COLOR},
            "dark": {k: v[1] for k, v in THEMED.items()}}


#: the sweep heat map (sweep_view.py): a cell's peak as a share of its GPU's memory, light (little)
#: to dark (nearly full): matplotlib's Blues
HEAT_COLORS = ("#f7fbff", "#deebf7", "#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b")
#: its other marks: cells that do not fit or failed, the fit boundary, the cells' text
SWEEP_COLORS = {"nofit": "#ffc1c0", "failed": "#d0d7de", "boundary": "#cf222e", "text": "#1f2328",
                "text_on_dark": "#ffffff", "grid": "#ffffff"}


#: where the lab extension keeps :func:`stylesheet` (``python -m xmem_jupyter.palette`` writes it)
LAB_CSS = "labextension/style/palette.css"


def lab_css() -> str:
    """The lab extension's copy of the theme's colours (``labextension/style/palette.css``)."""
    return ("/* Generated by `python -m xmem_jupyter.palette` from xmem_jupyter/palette.py: do not edit.\n"
            " * The colours of text and marks, light and dark (JupyterLab's theme), for the live widget,\n"
            " * its charts and the saved report. */\n" + stylesheet() + "\n")


if __name__ == "__main__":  # pragma: no cover
    from pathlib import Path

    out = Path(__file__).resolve().parents[1] / LAB_CSS
    out.write_text(lab_css())
    print(f"wrote {out}")
