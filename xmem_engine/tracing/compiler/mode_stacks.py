"""The tracer's modes taken off (and put back on) PyTorch's mode stacks around a compiled call.

Dynamo traces a compiled call's Python without the tracer's torch-function mode (the device
mode's rewrites would become part of the graph). From torch 2.10 a dispatch mode can stay on the
stack while Dynamo compiles (``TorchDispatchMode.ignore_compile_internals``: Dynamo turns it off
while compiling and the compiled code's ops reach it); before that, Dynamo compiles nothing while
a non-infra dispatch mode is on the stack ("non-infra torch dispatch mode present"), so there the
tracer's dispatch mode is taken off for the call and put back while the compiled code runs.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
import torch.utils._python_dispatch as python_dispatch

#: whether Dynamo compiles with a dispatch mode that ignores compile internals on the stack
DYNAMO_KEEPS_DISPATCH_MODES = hasattr(python_dispatch, "is_in_any_mode_without_ignore_compile_internals")


@contextlib.contextmanager
def without_function_mode(mode: Any) -> Iterator[None]:
    """The torch-function mode stack without ``mode`` (the others keep their order)."""
    n = torch._C._len_torch_function_stack()
    modes = [torch._C._pop_torch_function_stack() for _ in range(n)][::-1]
    for m in modes:
        if m is not mode:
            torch._C._push_on_torch_function_stack(m)
    try:
        yield
    finally:
        for _ in range(torch._C._len_torch_function_stack()):
            torch._C._pop_torch_function_stack()
        for m in modes:
            torch._C._push_on_torch_function_stack(m)


def dispatch_mode_of(which: Callable[[Any], bool]) -> Any | None:
    """The innermost mode on the dispatch stack for which ``which`` is true, or None."""
    for i in reversed(range(torch._C._len_torch_dispatch_stack())):
        m = torch._C._get_dispatch_stack_at(i)
        if which(m):
            return m
    return None


@contextlib.contextmanager
def without_dispatch_mode(mode: Any) -> Iterator[None]:
    """The dispatch stack without ``mode`` (None: unchanged), the others in their order.
    Infra modes (FakeTensorMode) live outside the user stack and are not touched."""
    n = torch._C._len_torch_dispatch_stack()
    if mode is None or all(torch._C._get_dispatch_stack_at(i) is not mode for i in range(n)):
        yield
        return
    modes = [python_dispatch._pop_mode() for _ in range(n)][::-1]
    for m in modes:
        if m is not mode:
            python_dispatch._push_mode(m)
    rest = [m for m in modes if m is not mode]
    try:
        with _non_infra_flag(any(not m.is_infra_mode() for m in rest)):
            yield
    finally:
        for _ in range(torch._C._len_torch_dispatch_stack()):
            python_dispatch._pop_mode()
        for m in modes:
            python_dispatch._push_mode(m)


@contextlib.contextmanager
def with_dispatch_mode(mode: Any) -> Iterator[None]:
    """``mode`` on the dispatch stack for the block, unless it is there already."""
    n = torch._C._len_torch_dispatch_stack()
    if mode is None or any(torch._C._get_dispatch_stack_at(i) is mode for i in range(n)):
        yield
        return
    python_dispatch._push_mode(mode)
    try:
        with _non_infra_flag(True):
            yield
    finally:
        python_dispatch._pop_mode()


@contextlib.contextmanager
def _non_infra_flag(value: bool) -> Iterator[None]:
    """The module flag Dynamo reads for "a non-infra dispatch mode is on the stack", which
    ``TorchDispatchMode.__enter__``/``__exit__`` keep and a raw push or pop does not."""
    old = python_dispatch._is_in_non_infra_torch_dispatch_mode
    python_dispatch._is_in_non_infra_torch_dispatch_mode = value
    try:
        yield
    finally:
        python_dispatch._is_in_non_infra_torch_dispatch_mode = old
