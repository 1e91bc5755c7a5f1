"""The ``type`` that Unsloth's modules see in fake mode (``shims/unsloth_checks.py``): it answers
``torch.Tensor`` for a fake tensor and is the builtin everywhere else. It was a plain function,
so ``isinstance(cls, type)`` raised in those modules: ``train_on_responses_only`` (every Unsloth
conversational notebook) stopped with "isinstance() arg 2 must be a type"."""

from __future__ import annotations

import builtins

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from xmem_engine.tracing.shims.unsloth_checks import _type_as_on_gpu as gpu_type


def test_a_fake_tensor_is_a_tensor_and_everything_else_its_own_type():
    with FakeTensorMode():
        fake = torch.zeros(2)
    assert gpu_type(fake) is torch.Tensor
    assert gpu_type(3) is int and gpu_type(torch.zeros(1)) is torch.Tensor
    assert gpu_type(torch.nn.Parameter(torch.zeros(1))) is torch.nn.Parameter


def test_isinstance_and_issubclass_answer_as_the_builtin():
    # unsloth_zoo.dataset_utils.train_on_responses_only: tuple(c for c in (...) if isinstance(c, type))
    assert isinstance(int, gpu_type) and isinstance(torch.Tensor, gpu_type)
    assert not isinstance(3, gpu_type) and not isinstance(None, gpu_type)
    assert issubclass(builtins.type, gpu_type) and not issubclass(int, gpu_type)


def test_classes_and_metaclasses_are_made_as_the_builtin_makes_them():
    made = gpu_type("Made", (object,), {"x": 1})
    assert builtins.type(made) is builtins.type and made.x == 1
    assert made.__module__ == __name__  # the caller's module, as type() names it

    class Router(gpu_type):  # gpt_oss derives a metaclass from type
        def __instancecheck__(cls, obj):
            return obj == "router"

    class Any_(metaclass=Router):
        pass

    assert isinstance("router", Any_) and not isinstance("other", Any_)
