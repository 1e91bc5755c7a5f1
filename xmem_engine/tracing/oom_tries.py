"""A batch-size search the code writes itself (``try: <a step at a size> except
torch.cuda.OutOfMemoryError: <a smaller size>``) runs out of memory where the target GPU would.

Why: the virtual GPU has no capacity of its own (an estimate runs the step whole, to say how
much it would need), so such a loop's first size always "fitted" and the estimate was of it:
320.55 GiB on a T4 for a loop from 65,536 that the GPU halves to 2,048 (10.55 GiB).
Each ``try`` in the traced source whose handler catches CUDA's out-of-memory error
(:func:`catches_oom`) gets two calls (:func:`mark`): while its body runs, the simulated
device holds what the GPU gives PyTorch (``batch_size_search.search_limit``), and a request
past it raises ``torch.OutOfMemoryError`` as the GPU does; each pass through the body is a
try, recorded with its outcome. The estimate is of the run without the tries that ran out of
memory (``batch_size_search.without_failed_tries``), as for accelerate's search. A search whose
every try ran out of memory is traced again without the limit (``run.py``): then the estimate
says how much its first try needs, not what was left after the GPU gave up.
A handler that re-raises or exits is not a search: the GPU run stops there, and the estimate
stays that of the step run whole.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import importlib.machinery
import importlib.util
import linecache
import sys
import threading
import types
from typing import Any, Iterator

import torch

from xmem_engine.tracing.frames import is_user_file
from xmem_engine.tracing.shims.batch_size_search import OOM, search_limit

#: exception names a handler catches CUDA's out-of-memory error by: its own, and those it derives
#: from (``except RuntimeError:  # out of memory``, as PyTorch's FAQ writes the handler)
OOM_NAMES = frozenset({"OutOfMemoryError", "RuntimeError", "Exception", "BaseException"})
EXITS = frozenset({"exit", "quit", "_exit"})
MODULE = __name__


def _names(node: ast.expr | None) -> list[str]:
    if node is None:
        return ["BaseException"]  # a bare ``except:``
    if isinstance(node, ast.Tuple):
        return [n for elt in node.elts for n in _names(elt)]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    return [node.id] if isinstance(node, ast.Name) else []


def _gives_up(handler: ast.ExceptHandler) -> bool:
    """The handler ends in ``raise`` or an exit: the run stops at the error, as on the GPU."""
    last = handler.body[-1]
    if isinstance(last, ast.Raise):
        return True
    call = last.value if isinstance(last, ast.Expr) else None
    return isinstance(call, ast.Call) and bool(set(_names(call.func)) & EXITS)


def catches_oom(handler: ast.ExceptHandler, broad: bool = True) -> bool:
    """Whether ``handler`` catches CUDA's out-of-memory error and goes on (a search, a loop that
    skips a batch too large, or a broad handler that logs the error): on the GPU it would catch
    it, so it does here. A broad handler around a step that does not fit is then an exhausted
    search (its one try ran out of memory), traced again without the limit. ``broad=False``:
    only a handler that names the error (in a class, whose methods Dynamo may compile: the
    marks' calls would break its graph where a broad handler is about something else)."""
    names = set(_names(handler.type))
    return bool(names & (OOM_NAMES if broad else {"OutOfMemoryError"})) and not _gives_up(handler)


def _call(name: str, line: int) -> ast.stmt:
    # ``__import__(MODULE, fromlist=...).name(line)``: no name of xmem's in the code's namespace
    module = ast.Call(ast.Name("__import__", ast.Load()), [ast.Constant(MODULE)],
                      [ast.keyword("fromlist", ast.Tuple([ast.Constant(name)], ast.Load()))])
    return ast.Expr(ast.Call(ast.Attribute(module, name, ast.Load()), [ast.Constant(line)], []))


def compiled_names(tree: ast.Module) -> set[str]:
    """Names of the functions the code hands to ``torch.compile`` (``torch.compile(step)``,
    ``torch.compile(self.step)``): their bodies are Dynamo's to trace."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and "compile" in _names(node.func):
            names.update(_names(node.args[0]))
    return names


def _is_compiled(node: ast.FunctionDef | ast.AsyncFunctionDef, names: set[str]) -> bool:
    """``@torch.compile`` (with or without arguments), or handed to it by name."""
    return node.name in names or any(
        "compile" in _names(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list)


class _Marker(ast.NodeTransformer):
    """Marks the handlers; not in a function Dynamo compiles: the marks' calls (``__import__``,
    the allocator's capacity) would break its graph, and Dynamo then ran the whole frame
    eagerly (a compiled step with ``try: ... except Exception`` was estimated uncompiled)."""

    def __init__(self, compiled: set[str], classes: int = 0) -> None:
        self.marked = 0
        self.classes = classes  # how deep in class bodies the visit is
        self.compiled = compiled

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.ClassDef:
        self.classes += 1
        self.generic_visit(node)
        self.classes -= 1
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        if not _is_compiled(node, self.compiled):
            self.generic_visit(node)
        return node

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Try(self, node: ast.Try) -> ast.Try:
        self.generic_visit(node)
        if any(catches_oom(h, broad=not self.classes) for h in node.handlers):
            inner = ast.Try(body=node.body, handlers=[], orelse=[], finalbody=[_call("leave", node.lineno)])
            node.body = [_call("enter", node.lineno), inner]  # located at the try's line (mark)
            self.marked += 1
        return node


def mark(tree: ast.Module) -> ast.Module:
    """``tree`` with each ``try`` that catches out of memory marked (``try: enter(line); try:
    <body> finally: leave(line)``); statements keep their lines. Unmarked when there is none."""
    return _marked(tree)[0]


def _marked(tree: ast.Module, compiled: set[str] | None = None, classes: int = 0) -> tuple[ast.Module, int]:
    marker = _Marker(compiled_names(tree) if compiled is None else compiled, classes)
    tree = marker.visit(tree)
    if marker.marked:
        ast.fix_missing_locations(tree)
    return tree, marker.marked


class _MarkedSource(importlib.machinery.SourceFileLoader):
    """A user's module compiled with its out-of-memory handlers marked (never from or into
    ``__pycache__``: the marks are the trace's, not the file's)."""

    tree: ast.Module | None = None

    def marks(self) -> bool:
        source = importlib.util.decode_source(self.get_data(self.path))  # its coding cookie, as import reads it
        if "except" not in source:
            return False
        self.tree, count = _marked(ast.parse(source, self.path))
        return count > 0

    def get_code(self, fullname: str) -> Any:
        return compile(self.tree, self.path, "exec", dont_inherit=True)


#: each file's source, parsed once: (source, tree, ids of the nodes in class bodies, compiled names)
_PARSED: dict[str, tuple[str, ast.Module | None, set[int], set[str]]] = {}


def _parsed(filename: str, source: str) -> tuple[ast.Module | None, set[int], set[str]]:
    """The file's tree (not to be changed: copy a node first), read once while its text stays
    the same: every function of an imported module of the user's is looked up in it."""
    hit = _PARSED.get(filename)
    if hit is None or hit[0] != source:
        try:
            tree: ast.Module | None = ast.parse(source, filename)
        except SyntaxError:
            tree = None
        methods = set() if tree is None else \
            {id(n) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for n in ast.walk(c)}
        hit = _PARSED[filename] = (source, tree, methods, set() if tree is None else compiled_names(tree))
    return hit[1], hit[2], hit[3]


def marked_code(fn: Any) -> types.CodeType | None:
    """A function's code with its out-of-memory handlers marked, compiled again from its source
    (``linecache``: a notebook's earlier cell, the user's file); None where it has none, or
    closes over variables (its code could not be swapped in)."""
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType) or code.co_freevars or not is_user_file(code.co_filename):
        return None
    lines = linecache.getlines(code.co_filename)
    last = max((line for _, _, line in code.co_lines() if line is not None), default=0)
    if "except" not in "".join(lines[code.co_firstlineno - 1:last]):  # (most functions: no parse)
        return None
    tree, methods, names = _parsed(code.co_filename, "".join(lines))
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == code.co_name and \
                min([node.lineno] + [d.lineno for d in node.decorator_list]) == code.co_firstlineno:
            if _is_compiled(node, names):
                return None
            in_class = id(node) in methods
            node = copy.deepcopy(node)
            node.decorator_list = []  # the code object only: the function object has them already
            # a method is marked as in its class body: handlers that name OutOfMemoryError only
            module, count = _marked(ast.Module(body=[node], type_ignores=[]), names, int(in_class))
            if not count:
                return None
            compiled = compile(module, code.co_filename, "exec", dont_inherit=True)
            return next(c for c in compiled.co_consts if isinstance(c, types.CodeType) and c.co_name == code.co_name)
    return None


def _functions(values: list[Any]) -> Iterator[types.FunctionType]:
    """The functions among ``values``, and the methods of the classes among them."""
    for value in values:
        if isinstance(value, types.FunctionType):
            yield value
        elif isinstance(value, type):
            for attr in list(vars(value).values()):
                attr = getattr(attr, "__func__", attr)  # a staticmethod's or classmethod's function
                if isinstance(attr, types.FunctionType):
                    yield attr


def _user_modules_in(values: list[Any]) -> Iterator[types.ModuleType]:
    """The user's own modules among ``values`` (a notebook's ``import train_utils``, before the
    trace): :class:`UserModules` marks those the traced code imports, these were loaded
    unmarked. Only those the namespace holds: every module of the process would be hundreds
    (a test run's), and the cell reaches a module's search through its name."""
    for module in values:
        file = getattr(module, "__file__", None) if isinstance(module, types.ModuleType) else None
        if isinstance(file, str) and file.endswith(".py") and is_user_file(file):
            yield module


@contextlib.contextmanager
def marked_functions(namespace: dict | None) -> Iterator[None]:
    """The namespace's functions and classes' methods (an earlier notebook cell's ``def
    find_batch_size(...)``), and those of the user's modules it holds (imported before the
    trace), run their marked code while the block lasts, their own after."""
    values = list((namespace or {}).values())
    for module in list(_user_modules_in(values)):
        values += [v for v in list(vars(module).values()) if getattr(v, "__module__", None) == module.__name__]
    swapped: list[tuple[Any, types.CodeType]] = []
    seen: set[int] = set()
    for fn in _functions(values):
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        new = marked_code(fn)
        if new is not None:
            swapped.append((fn, fn.__code__))
            fn.__code__ = new
    try:
        yield
    finally:
        for fn, code in swapped:
            fn.__code__ = code


class UserModules:
    """A meta-path finder: a module of the user's (not a library's: ``frames.is_user_file``)
    that the traced code imports, and that catches out of memory, loads marked, as the traced
    code is. Packages found to be libraries are passed over by name after their first import."""

    def __init__(self) -> None:
        self.libraries: set[str] = set(sys.builtin_module_names)

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        root = name.partition(".")[0]
        if root in self.libraries:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return None
        if not is_user_file(spec.origin or ""):
            self.libraries.add(root)
            return None
        loader = _MarkedSource(spec.name, spec.origin)
        if not loader.marks():
            return None
        spec.loader = loader
        return spec


class Searches:
    """The tracer's searches: each marked ``try`` (by its file and line), its passes in order."""

    def __init__(self, tracer: Any, limit: int) -> None:
        self.tracer = tracer
        self.limit = limit
        self.open: list[tuple[str, int, int | None]] = []  # where, first event, the capacity before
        self.tries: dict[str, list[list[Any]]] = {}  # where -> [outcome, first event, last event]
        # the thread that traces: another thread's try (a logger's ``except Exception``) neither
        # holds the device to the GPU's memory for everyone nor interleaves with its tries
        self.thread = threading.get_ident()

    def enter(self, where: str) -> None:
        allocator = self.tracer.allocator
        self.open.append((where, len(self.tracer.events), allocator.capacity))
        allocator.capacity = self.limit if allocator.capacity is None else min(allocator.capacity, self.limit)

    def leave(self, error: BaseException | None) -> None:
        where, start, capacity = self.open.pop()
        self.tracer.allocator.capacity = capacity
        outcome = "ran" if error is None else OOM if isinstance(error, torch.OutOfMemoryError) else "stopped"
        self.tries.setdefault(where, []).append([outcome, start, len(self.tracer.events)])

    def exhausted(self) -> list[str]:
        """The searches none of whose tries ran (each ran out of memory)."""
        return [w for w, tries in self.tries.items() if all(t[0] == OOM for t in tries)]

    def finish(self) -> None:
        """Failed tries out of the estimate; each search that ran out of memory in the notes and
        ``batch_size_search``. A ``try`` that never ran out of memory searched nothing: unsaid."""
        for where, tries in self.tries.items():
            if not any(t[0] == OOM for t in tries):
                continue
            self.tracer.failed_tries += [(start, end) for outcome, start, end in tries if outcome == OOM]
            search = as_data(where, tries, self.limit)
            self.tracer.notes.append(note(search))
            self.tracer.batch_searches.append(search)


def as_data(where: str, tries: list[list[Any]], limit: int) -> dict:
    """As ``batch_size_search.as_data``, for a search whose sizes are the code's variables: the
    tries' outcomes in order, no sizes (``batch_size`` null), ``found`` null."""
    return {"where": where, "limit_bytes": limit, "found": None, "by": "try/except",
            "tries": [{"batch_size": None, "outcome": outcome} for outcome, _, _ in tries]}


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def note(search: dict) -> str:
    """The notes' sentence for a search of the code's own (``as_data``'s dict)."""
    outcomes = [t["outcome"] for t in search["tries"]]
    failed, ran = outcomes.count(OOM), outcomes.count("ran")
    first = outcomes.index(OOM) + 1
    head = (f"The try at {search['where']} catches CUDA's out-of-memory error and goes on: on the GPU's "
            f"{search['limit_bytes'] / 2**30:.2f} GiB for PyTorch (its memory less the CUDA context, the kernels and "
            f"cuBLAS's workspaces) its body ran {_times(len(outcomes))} and ran out of memory {_times(failed)} "
            f"(first on pass {first}), as on the GPU. ")
    if ran:
        return head + (f"The estimate is of the {_times(ran).replace('once', 'one pass').replace('times', 'passes')} "
                       "that ran to the end: the failed ones filled the GPU up to its capacity before they failed, "
                       "and what they freed is left out")
    return head + ("No pass ran to its end, so the estimate is of the code traced again without the GPU's limit: "
                   "what its first pass needs")


_ACTIVE: list[Searches] = []  # the trace's searches, while it runs (one trace at a time)


def enter(line: int) -> None:
    """Called by a marked ``try`` as its body starts (:func:`mark`)."""
    if _ACTIVE and _ACTIVE[-1].thread == threading.get_ident():
        _ACTIVE[-1].enter(f"{sys._getframe(1).f_code.co_filename}:{line}")


def leave(line: int) -> None:
    """Called as a marked ``try``'s body ends, however it ends (its ``finally``)."""
    if _ACTIVE and _ACTIVE[-1].open and _ACTIVE[-1].thread == threading.get_ident():
        _ACTIVE[-1].leave(sys.exc_info()[1])


@contextlib.contextmanager
def oom_tries(tracer: Any) -> Iterator[Searches]:
    """The marked ``try`` bodies run on the target GPU's capacity while the block lasts (not at
    all where ``tracer.oom_tries_off``: the trace that follows an exhausted search); the user's
    modules the code imports meanwhile are marked as they load (:class:`UserModules`)."""
    vc = tracer.vc
    searches = Searches(tracer, search_limit(vc.device_dict, vc.props.total_memory, vc.context_bytes))
    tracer.oom_searches = searches
    if getattr(tracer, "oom_tries_off", False):
        yield searches
        return
    _ACTIVE.append(searches)
    finder = UserModules()
    sys.meta_path.insert(0, finder)
    try:
        yield searches
    finally:
        sys.meta_path.remove(finder)
        _ACTIVE.remove(searches)
        while searches.open:  # a trace stopped inside a try (max_iterations): the device as it was
            searches.leave(StopIteration())
        searches.finish()
