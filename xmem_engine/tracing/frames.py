"""Whose code a frame is: the user's, or torch's / xmem's / the standard library's.

The tracer labels each allocation with the innermost user frame (``file:line``), and shows
the user tracebacks that start in their own code: xmem's frames (and torch's below the
tracer's modes) are machinery the user did not write. Everything that decides which frames
count as the user's lives here.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import traceback
import types
import warnings
from typing import Any, Callable

import torch

XMEM_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # xmem_engine/
TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_LIB_DIRS = (TORCH_DIR, XMEM_DIR) + tuple(
    p + os.sep for p in {sysconfig.get_paths().get("stdlib", ""), sysconfig.get_paths().get("platstdlib", "")} if p
)
_IS_USER: dict[str, bool] = {}


def is_user_file(filename: str) -> bool:
    """Whether code in ``filename`` is the user's: not torch's, xmem's, the standard library's,
    or an installed package's (``site-packages``, or a Debian system Python's ``dist-packages``)."""
    r = _IS_USER.get(filename)
    if r is None:
        r = not (filename.startswith(_LIB_DIRS) or filename.startswith("<frozen")
                 or "site-packages" in filename or "dist-packages" in filename)
        _IS_USER[filename] = r
    return r


def count_as_user(filename: str) -> None:
    """The traced script's own file is the user's code wherever it lives, for the rest of the
    process (its tracebacks are reported after the trace): a library's script run as the
    script, such as TRL's ``trl/scripts/sft.py`` in site-packages, is named in the notes as
    ``sft.py:113``, not passed over as library code."""
    _IS_USER[filename] = True


_OP_NAMES: dict[Any, str] = {}


def op_name(func: Any) -> str:
    """``str(func)`` ("aten.mm.default"), remembered: OpOverload builds it on every call."""
    name = _OP_NAMES.get(func)
    if name is None:
        name = _OP_NAMES[func] = str(func)
    return name


#: per thread, the user's line that started it (``shims/threads.py``): a thread whose target is a
#: library's (``Thread(target=model.generate)``) has no user frame of its own
thread_origin = threading.local()


def user_frame(depth: int = 2) -> str:
    """``file:line`` of the innermost frame of user code (not torch, not xmem, not stdlib); in a
    thread with none, the line that started the thread."""
    f: types.FrameType | None = sys._getframe(depth)
    while f is not None:
        fn = f.f_code.co_filename
        if is_user_file(fn):
            return f"{fn}:{f.f_lineno}"
        f = f.f_back
    return getattr(thread_origin, "where", "")


def warning_where_torch_would(call: Callable[[], Any]) -> Any:
    """``call()``, with the warnings it raises shown at the innermost frame outside xmem. A
    C++ warning (``Converting a tensor with requires_grad=True to a scalar``) names the
    innermost Python frame: on a GPU the code that asked, under the tracer its mode's method."""
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            return call()
    finally:
        f: types.FrameType | None = sys._getframe(1) if caught else None
        while f is not None and f.f_code.co_filename.startswith(XMEM_DIR):
            f = f.f_back
        for w in caught:  # through the caller's own filters, once per its line as Python does
            if f is None:
                warnings.warn(w.message, w.category)
            else:
                g = f.f_globals
                warnings.warn_explicit(w.message, w.category, f.f_code.co_filename, f.f_lineno,
                                       module=g.get("__name__"), registry=g.setdefault("__warningregistry__", {}))


def library_frame(depth: int = 2, skip: frozenset[types.CodeType] = frozenset()) -> str:
    """``file:line`` of the innermost frame outside torch, xmem and the standard library: a
    library such as transformers (named from its ``site-packages`` folder on), or the user's.
    Frames running a code in ``skip`` (a library's wrapper of a torch function) are passed over."""
    f: types.FrameType | None = sys._getframe(depth)
    while f is not None:
        if f.f_code in skip:
            f = f.f_back
            continue
        fn = f.f_code.co_filename
        # (a virtual environment's platstdlib holds its site-packages: those are libraries)
        ours = fn.startswith(_LIB_DIRS) and ("site-packages" not in fn or fn.startswith((TORCH_DIR, XMEM_DIR)))
        if not (ours or fn.startswith("<frozen")):
            for folder in ("site-packages", "dist-packages"):
                marker = fn.find(folder + os.sep)
                if marker >= 0:
                    return f"{fn[marker + len(folder) + 1:]}:{f.f_lineno}"
            return f"{fn}:{f.f_lineno}"
        f = f.f_back
    return ""


def run_user_code(code: Any, scratch: dict | None) -> None:
    """The one frame between the tracer and the user's code (tracebacks start after it)."""
    if scratch is not None:
        exec(code, scratch)
    else:
        code()


_ENTRY_CODES: set[types.CodeType] = {run_user_code.__code__}
RAISED_AS_TORCH = "_xmem_raised_as_torch"


def as_torch_error(e: BaseException) -> BaseException:
    """Mark an error the tracer raises where torch on a GPU would (a simulated out-of-memory,
    a negative size): the user's traceback ends at their torch call, as on a GPU."""
    setattr(e, RAISED_AS_TORCH, True)
    return e


def trim_traceback(e: BaseException) -> bool:
    """Show the user's code, not the tracer: the traceback starts where the user's code was
    entered (the frame after :func:`run_user_code`), and when the error was raised inside
    torch below one of the tracer's modes (or by the tracer as torch would: :func:`as_torch_error`)
    it ends where the user's (or a library's) code called into the tracer - as on a GPU, where
    the op raises from C++. Any other error raised by the tracer's own code keeps its frames. False if the error did not come from user code."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code is not run_user_code.__code__:
        tb = tb.tb_next
    if tb is None:
        return False
    start = tb.tb_next
    if start is None:
        return True
    e.__traceback__ = start
    frames = []
    t = start
    while t is not None:
        frames.append(t)
        t = t.tb_next
    if frames[-1].tb_frame.f_code.co_filename.startswith(TORCH_DIR) or getattr(e, RAISED_AS_TORCH, False):
        # from the last frame of code that is neither torch's nor xmem's: a shim that calls back
        # into the code (mp.spawn's function, run here) keeps the frames below it
        names = [t.tb_frame.f_code.co_filename for t in frames]
        last = max((i for i, n in enumerate(names) if not n.startswith((TORCH_DIR, XMEM_DIR))), default=0)
        for prev, cur, name in zip(frames[last:], frames[last + 1:], names[last + 1:]):
            if name.startswith(XMEM_DIR):
                prev.tb_next = None
                break
    return True


def entry_point(fn: Callable) -> Callable:
    """Mark ``fn`` as a public entry of the tracer: :func:`strip_to_user_code` drops it and
    every frame above it (the CLI's, the notebook's)."""
    _ENTRY_CODES.add(fn.__code__)
    return fn


def strip_to_user_code(e: BaseException) -> BaseException:
    """Start ``e``'s traceback at the user's code: after the innermost tracer entry point
    (or :func:`run_user_code`) that it passed through. The one place that decides which
    frames a user sees; the CLI and the notebook both show tracebacks through it."""
    t = e.__traceback__
    while t is not None:
        if t.tb_frame.f_code in _ENTRY_CODES and t.tb_next is not None:
            e.__traceback__ = t.tb_next
            break
        t = t.tb_next
    return e


def user_traceback_lines(e: BaseException) -> list[str]:
    """The traceback of an exception re-raised by the tracer, from the user's code on."""
    strip_to_user_code(e)
    return traceback.format_exception(type(e), e, e.__traceback__)
