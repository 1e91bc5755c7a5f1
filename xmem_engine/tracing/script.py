"""Trace a training script as ``python SCRIPT`` would run it, with ``--set`` overrides
(``xmem_engine/overrides.py``)."""

from __future__ import annotations

import linecache
import os
import sys
from pathlib import Path
from typing import Any

from xmem_engine.overrides import load_script
from xmem_engine.trace import Trace
from xmem_engine.tracing.run import trace


def trace_script(
    path: str | Path,
    *,
    mode: str = "auto",
    overrides: dict[str, str] | None = None,
    allocator: Any = None,
    device: dict | None = None,
    max_iterations: int | None = None,
    torch_version: str | None = None,
    source: str | None = None,
    world: Any = None,
    argv: list[str] | None = None,
    compile: str | None = None,
) -> Trace:
    """Trace a training script as ``python SCRIPT`` would run it (``__name__ == "__main__"``,
    its directory first on ``sys.path``, ``sys.argv == [SCRIPT, *argv]``). ``max_iterations`` as in
    :func:`xmem_engine.tracing.trace`. ``source``: the script's text, read earlier (``xmem
    sweep`` ships it to workers that may lack the file); ``path`` still names it, so
    tracebacks and notes show the user's file and lines."""
    path = os.path.abspath(path)
    code = load_script(path, overrides, source)
    if source is not None:  # the lines notes and tracebacks quote: this text, not the disk's
        linecache.cache[path] = (len(source), None, source.splitlines(True), path)
    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [path, *(argv or ())]
    sys.path.insert(0, os.path.dirname(path))
    try:
        tr = trace(code, namespace, mode=mode, allocator=allocator, device=device, filename=path,
                   max_iterations=max_iterations, torch_version=torch_version, world=world,
                   compile=compile)
    finally:
        sys.argv = old_argv
        sys.path[:] = old_path
    tr.meta["script"] = path
    if overrides:
        tr.meta["overrides"] = dict(overrides)
    if argv:
        tr.meta["argv"] = list(argv)
    return tr
