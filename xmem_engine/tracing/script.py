"""Trace a training script as ``python SCRIPT`` would run it, with ``--set`` overrides
(``xmem_engine/overrides.py``)."""

from __future__ import annotations

import builtins
import linecache
import os
import sys
from pathlib import Path
from typing import Any

from xmem_engine.overrides import parse_script
from xmem_engine.trace import Trace
from xmem_engine.tracing.oom_tries import mark as mark_oom_tries
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
    symbolic: Any = None,
) -> Trace:
    """Trace a training script as ``python SCRIPT`` would run it (``__name__ == "__main__"``,
    its directory first on ``sys.path``, ``sys.argv == [SCRIPT, *argv]``). ``max_iterations`` as in
    :func:`xmem_engine.tracing.trace`. ``source``: the script's text, read earlier (``xmem
    sweep`` ships it to workers that may lack the file); ``path`` still names it, so
    tracebacks and notes show the user's file and lines. ``symbolic``: a
    :class:`~xmem_engine.tracing.symbolic.SymbolicBatch` whose variable's top-level assignment
    takes its symbol instead (fake mode only)."""
    path = os.path.abspath(path)
    setup: list = []
    if symbolic is not None:
        import ast

        from xmem_engine.tracing.symbolic import NAME, names

        if mode != "fake":
            raise ValueError(f"a symbolic {symbolic.variable} needs mode='fake', not {mode!r}")
        overrides = {**(overrides or {}), symbolic.variable: ast.Name(NAME, ast.Load())}
        setup.append(lambda tracer: setattr(tracer, "symbolic", symbolic))
    code = builtins.compile(mark_oom_tries(parse_script(path, overrides, source)), path, "exec", dont_inherit=True)
    if source is not None:  # the lines notes and tracebacks quote: this text, not the disk's
        linecache.cache[path] = (len(source), None, source.splitlines(True), path)
    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
    if symbolic is not None:
        namespace.update(names(symbolic))
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [path, *(argv or ())]
    sys.path.insert(0, os.path.dirname(path))
    try:
        tr = trace(code, namespace, mode=mode, allocator=allocator, device=device, filename=path,
                   max_iterations=max_iterations, torch_version=torch_version, world=world,
                   compile=compile, setup=setup)
    finally:
        sys.argv = old_argv
        sys.path[:] = old_path
    tr.meta["script"] = path
    if overrides:
        tr.meta["overrides"] = {k: v for k, v in overrides.items() if isinstance(v, str)}
    if argv:
        tr.meta["argv"] = list(argv)
    return tr
