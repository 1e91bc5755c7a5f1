"""BokehJS for the widget, inline (no network) and found again after a page reload.

``jupyter_bokeh.BokehModel`` expects ``window.Bokeh`` in the page. Loading it once per
kernel with ``output_notebook()`` breaks after a page reload against the same kernel: the
widgets are re-created from the kernel's state but the loader output is gone. So the loader
lives in an ``ipywidgets.Output`` *widget*, shared by every xmem widget of the kernel and
placed before the charts: each view of it (each display, and every re-render after a
reload) runs the inline BokehJS again. One shared model keeps the ~4 MB once in the saved
widget state, not once per output.
"""

from __future__ import annotations

import ipywidgets as widgets

_LOADER: widgets.Output | None = None


JS_MIME = "application/javascript"


def loader_bundles() -> list[dict]:
    """The MIME bundles ``bokeh.io.output_notebook(INLINE)`` publishes, captured.

    Kept as ``application/javascript`` only: JupyterLab runs that synchronously when the
    (trusted) Output widget renders, before the charts' views are created next to it. The
    bundle also carries the same 4 MB again as ``application/vnd.bokehjs_load.v0+json``,
    whose renderer loads BokehJS later (charts created before then fail to render), and
    widget state, which travels on every page load, should not carry BokehJS twice."""
    import bokeh.io.notebook as nb
    from bokeh.resources import INLINE

    captured: list[dict] = []
    original = nb.publish_display_data
    nb.publish_display_data = lambda data, metadata=None, **kw: captured.append(  # type: ignore[assignment]
        {"data": data, "metadata": metadata or {}})
    try:
        nb.load_notebook(resources=INLINE, hide_banner=True)
    finally:
        nb.publish_display_data = original  # type: ignore[assignment]
    return [{"data": {JS_MIME: b["data"][JS_MIME]}, "metadata": b["metadata"]}
            for b in captured if JS_MIME in b["data"]]


def bokeh_loader() -> widgets.Output:
    """The kernel's one loader widget (created on first use)."""
    global _LOADER
    if _LOADER is None or _LOADER.comm is None:
        out = widgets.Output(layout=widgets.Layout(height="0px", overflow="hidden"))
        out.outputs = tuple({"output_type": "display_data", "data": b["data"], "metadata": b["metadata"]}
                            for b in loader_bundles())
        out.add_class("xmem-bokeh-loader")
        _LOADER = out
    return _LOADER
