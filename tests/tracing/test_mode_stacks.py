"""The tracer's modes off and on PyTorch's mode stacks around compiled calls (mode_stacks.py)."""

import torch
import torch.utils._python_dispatch as python_dispatch
from torch.utils._python_dispatch import TorchDispatchMode

from xmem_engine.tracing.compiler.mode_stacks import (dispatch_mode_of, with_dispatch_mode, without_dispatch_mode,
                                                      without_function_mode)


class Seen(TorchDispatchMode):
    def __init__(self, name):
        super().__init__()
        self.name, self.ops = name, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _stack():
    return [torch._C._get_dispatch_stack_at(i) for i in range(torch._C._len_torch_dispatch_stack())]


def test_a_dispatch_mode_is_taken_off_and_put_back_in_its_place():
    outer, inner = Seen("outer"), Seen("inner")
    with outer, inner:
        assert dispatch_mode_of(lambda m: getattr(m, "name", None) == "outer") is outer
        with without_dispatch_mode(outer):
            assert _stack() == [inner]
            torch.ones(2) + 1
            # Dynamo before torch 2.10 reads this flag to refuse compiling under a user mode
            assert python_dispatch._is_in_non_infra_torch_dispatch_mode
            with without_dispatch_mode(inner):
                assert _stack() == [] and not python_dispatch._is_in_non_infra_torch_dispatch_mode
                torch.ones(2) + 1
                with with_dispatch_mode(outer):  # the compiled code's runtime: the mode sees its ops
                    assert _stack() == [outer] and python_dispatch._is_in_non_infra_torch_dispatch_mode
                    torch.ones(2) * 3
                assert _stack() == []
        assert _stack() == [outer, inner]
    assert "aten.mul.Tensor" in outer.ops and outer.ops.count("aten.add.Tensor") == 0
    assert inner.ops.count("aten.add.Tensor") == 1  # the first add only


def test_putting_on_a_mode_already_there_changes_nothing():
    m = Seen("m")
    with m:
        with with_dispatch_mode(m), without_dispatch_mode(None):
            assert _stack() == [m]
        assert _stack() == [m]
    assert _stack() == []


def test_a_function_mode_is_taken_off_and_put_back():
    class F(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    a, b = F(), F()
    with a, b:
        with without_function_mode(a):
            assert torch._C._len_torch_function_stack() == 1
        assert torch._C._len_torch_function_stack() == 2
