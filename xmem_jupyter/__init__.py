"""xmem_jupyter: the notebook front of xmem (the ``%%xmem`` magic and its widget).

Everything that computes lives in :mod:`xmem_engine`; this package only presents it.
``%load_ext xmem_jupyter`` registers ``%%xmem`` / ``%xmem`` and ``%xmem_config``.

Modules: magic (the magics), session (traces and estimates of one run, cached), widget (the
ipywidgets layout and its controls), charts (the Bokeh figures), flame (lifetimes ->
stacked rectangles), timeline (allocated / reserved lines), report (static HTML + MIME
bundle), progress, batching (the batch-size variable), cellcode (line numbers, iterations),
config (per-notebook defaults), bokeh_loader (inline BokehJS that survives a page reload),
sweep_view (an ``xmem sweep``'s heat map: peak per GPU x batch size, with the fit boundary).
"""

from __future__ import annotations


def load_ipython_extension(ipython) -> None:
    from xmem_jupyter.magic import XmemMagics

    ipython.register_magics(XmemMagics)


def unload_ipython_extension(ipython) -> None:
    """Nothing to undo beyond IPython's own bookkeeping (magics stay until restart)."""
