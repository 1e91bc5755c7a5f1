"""Parameter subclasses over fake data, as Dynamo sees the real ones.

In fake mode a library's parameter class (bitsandbytes' ``Params4bit``, ``Int8Params``) is made
a subclass of ``FakeTensor`` too (``shims/bitsandbytes_shim.fake_class``). Dynamo judges a
tensor by its class, and two things of ``FakeTensor`` made it judge these unlike the real ones:

- a ``__torch_dispatch__`` that is not ``torch.Tensor``'s: Dynamo wraps such an object as a
  plain Python object, not a tensor, so a call that passes it (a Triton kernel's launch) broke
  the graph ("Failed to convert args/kwargs to proxy");
- ``FakeTensor.device``, a Python property: Dynamo takes it for the subclass's own override of
  ``.device`` and, the property being in torch's skip list, broke the graph at every
  ``weight.device`` ("Attempted to call function marked as skipped").

A compiled QLoRA block (Unsloth's) had 56 such graph breaks a GPU run does not have. Here both
answers are the real class's: such objects are wrapped as tensors (the ``FakeTensor`` type's
own entry in Dynamo's table), and an attribute counts as overridden only where the library's
class overrides it.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Iterator

import torch


def fake_parameter_classes() -> list[type]:
    """The parameter subclasses over fake data made so far (direct subclasses of both)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return [c for c in FakeTensor.__subclasses__() if issubclass(c, torch.nn.Parameter)]


@contextlib.contextmanager
def dynamo_sees_library_classes() -> Iterator[Any]:
    """While the trace lasts; yields ``register()``, to be called before Dynamo runs, which adds
    the fake parameter classes made since to Dynamo's table of tensor types."""
    from torch._dynamo.variables import builder, torch_function

    table = builder.VariableBuilder._type_dispatch()
    wrap = table.get(torch._subclasses.FakeTensor)
    added: list[type] = []  # the fake parameter classes registered; each one's first base is the library's

    def register() -> None:
        if wrap is None:
            return
        for cls in fake_parameter_classes():
            if cls not in table:
                table[cls] = wrap
                added.append(cls)

    check = "_is_attr_overridden" if hasattr(torch_function, "_is_attr_overridden") else "_is_attr_overidden"  # torch < 2.7
    real_overridden = getattr(torch_function, check)

    def is_attr_overridden(tx: Any, var: Any, name: str) -> bool:
        try:
            cls = var.python_type()
        except Exception:  # noqa: BLE001 - a variable without a Python type: Dynamo's own answer
            cls = None
        if cls not in added:
            return real_overridden(tx, var, name)
        library = cls.__bases__[0]
        try:
            return inspect.getattr_static(library, name) != getattr(torch.Tensor, name)
        except AttributeError:
            return False

    setattr(torch_function, check, is_attr_overridden)
    try:
        yield register
    finally:
        setattr(torch_function, check, real_overridden)
        for cls in added:
            table.pop(cls, None)
