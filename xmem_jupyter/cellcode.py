"""The cell as the tracer runs it: line numbers as in the notebook, optionally repeated.

The body of a ``%%xmem`` cell starts on the cell's second line, so one blank line is put in
front: an error on line 4 of the cell is reported as line 4. The source is registered in
``linecache`` under a name like ``In[7]`` so that tracebacks show the user's lines and the
flame chart's "line" reads ``In[7]:4``. The cell runs as a loop over its statements
(``xmem_engine/tracing/steady.py``: the training step repeated, the model built once), made at the AST level,
which keeps every line number (re-indenting the text would not).
"""

from __future__ import annotations

import linecache
import types

from xmem_engine.tracing.steady import steady_code


def cell_filename(execution_count: int | None) -> str:
    return f"In[{execution_count}]" if execution_count else "In[ ]"


def running_cell_number(shell) -> int | None:
    """The number the notebook shows on the cell now running. IPython 9 counts a cell in
    ``execution_count`` before running it (IPython 8 after), so that attribute is one ahead
    there; the last cell IPython compiled (the one calling the magic) is right in both."""
    names = getattr(getattr(shell, "compile", None), "_filename_map", None)
    if names:
        return list(names.values())[-1]
    return getattr(shell, "execution_count", None)


def register(source: str, filename: str) -> None:
    """Make ``source`` what tracebacks show for ``filename``."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)


def compile_cell(source: str, filename: str, iterations: int | None = 1) -> types.CodeType:
    """Compile ``source`` to run its training step ``iterations`` times
    (``xmem_engine.tracing.steady``): 1 as written; None the steady state (a cell that runs
    one step runs it twice, the model and optimizer built once); N the step N times."""
    register(source, filename)
    return steady_code(source, filename, iterations)
