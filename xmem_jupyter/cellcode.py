"""The cell as the tracer runs it: line numbers as in the notebook, optionally repeated.

The body of a ``%%xmem`` cell starts on the cell's second line, so one blank line is put in
front: an error on line 4 of the cell is reported as line 4. The source is registered in
``linecache`` under a name like ``In[7]`` so that tracebacks show the user's lines and the
flame chart's "line" reads ``In[7]:4``. ``--iterations N`` wraps the cell in a loop at the
AST level, which keeps every line number (re-indenting the text would not).
"""

from __future__ import annotations

import ast
import linecache
import types


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


def compile_cell(source: str, filename: str, iterations: int = 1) -> types.CodeType:
    """Compile ``source``; with ``iterations`` > 1, as ``for _ in range(iterations): <cell>``."""
    register(source, filename)
    if iterations <= 1:
        return compile(source, filename, "exec", dont_inherit=True)
    tree = ast.parse(source, filename)
    if not tree.body:
        return compile(source, filename, "exec", dont_inherit=True)
    first = tree.body[0]
    loop = ast.For(target=ast.Name("_xmem_iteration", ast.Store()),
                   iter=ast.Call(ast.Name("range", ast.Load()), [ast.Constant(iterations)], []),
                   body=tree.body, orelse=[])
    ast.copy_location(loop, first)
    loop.end_lineno, loop.end_col_offset = tree.body[-1].end_lineno, tree.body[-1].end_col_offset
    module = ast.Module(body=[loop], type_ignores=[])
    ast.fix_missing_locations(module)
    return compile(module, filename, "exec", dont_inherit=True)
