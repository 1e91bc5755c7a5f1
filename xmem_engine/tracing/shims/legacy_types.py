"""The legacy tensor types on the virtual GPU: ``torch.cuda.FloatTensor`` and its kin.

Why: code from before PyTorch 0.4 still circulates in courses and popular repositories
(PyTorch-GAN's ``Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor``, then
``Tensor(n, 1).fill_(1.0)`` and ``imgs.type(Tensor)``; ``dtype = torch.cuda.FloatTensor``
in old tutorials). Those names are C++ tensor types that initialize CUDA when called or
converted to ("Found no NVIDIA driver"), and the virtual GPU's tensors are host tensors to
C++: ``x.type()`` said ``torch.FloatTensor``, ``isinstance(x, torch.cuda.FloatTensor)`` was
False and ``x.type(torch.FloatTensor)`` left ``x`` on the GPU.

How, for the duration of a trace: each ``torch.cuda.<T>Tensor`` is a stand-in class whose call
makes the tensor on the host with the CPU type's constructor and moves it to the virtual GPU
(the GPU's one allocation), and whose ``isinstance`` holds for virtual GPU tensors of its dtype;
``Tensor.type`` names and converts as on a GPU (``.to(device, dtype)``, no copy when already of
the type); ``torch.set_default_tensor_type`` of a CUDA type sets the default dtype and device.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

from xmem_engine.tracing.patches import patched_attr

NAMES = ("FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor",
         "ShortTensor", "CharTensor", "ByteTensor", "BoolTensor")


class _CudaType(type):
    """The metaclass of the stand-ins: a call builds on the host then moves to the virtual GPU."""

    dtype: torch.dtype
    is_cuda = True
    _host: Any  # the CPU tensor type of the same dtype (a C++ tensortype)

    def __call__(cls, *args: Any, **kwargs: Any) -> torch.Tensor:
        kwargs.pop("device", None)
        return cls._host(*args, **kwargs).to("cuda")

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, torch.Tensor) and obj.is_cuda and obj.dtype == cls.dtype

    def __repr__(cls) -> str:
        return f"<class 'torch.cuda.{cls.__name__}'>"


def _stand_in(name: str) -> type:
    host = getattr(torch, name)
    return _CudaType(name, (), {"dtype": host.dtype, "_host": host, "__module__": "torch.cuda"})


def _resolve(t: Any) -> tuple[torch.dtype, bool] | None:
    """(dtype, on CUDA) of a legacy type given as a class (C++ or a stand-in) or its name."""
    if isinstance(t, str):
        module, _, name = t.rpartition(".")
        if module not in ("torch", "torch.cuda") or name not in NAMES:
            return None
        return getattr(torch, name).dtype, module == "torch.cuda"
    if isinstance(t, _CudaType):
        return t.dtype, True
    if type(t).__name__ == "tensortype":
        return t.dtype, bool(t.is_cuda)
    return None


def tensor_type(is_gpu: Callable[[torch.Tensor], bool], to: Callable[..., Any]) -> Callable[..., Any]:
    """``Tensor.type`` for the device mode (which is off while its handlers run: ``is_gpu`` and
    ``to`` are its own): the type's name, or the tensor converted to it, as on a GPU."""

    def handler(func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        t = args[0]
        target = args[1] if len(args) > 1 else kwargs.get("dtype")
        if target is None:
            name = func(t)
            return name.replace("torch.", "torch.cuda.", 1) if is_gpu(t) and not name.startswith("torch.cuda.") else name
        legacy = _resolve(target)
        if legacy is None:  # a torch.dtype: torch's own conversion
            return func(*args, **kwargs)
        dtype, cuda = legacy
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
        return to(torch.Tensor.to, (t,), {"device": "cuda" if cuda else "cpu", "dtype": dtype,
                                          "non_blocking": non_blocking})

    return handler


def _set_default_tensor_type(orig: Callable[[Any], None]) -> Callable[[Any], None]:
    made_cuda = []  # whether this trace set the default device to the virtual GPU

    def set_default_tensor_type(t: Any, /) -> None:
        legacy = _resolve(t)
        if legacy is None or not legacy[1]:
            orig(t)
            if made_cuda:  # back to a host type: the host again, as torch's C++ does
                torch.set_default_device(None)
                made_cuda.clear()
            return
        torch.set_default_dtype(legacy[0])
        torch.set_default_device("cuda")
        made_cuda.append(True)

    return set_default_tensor_type


@contextlib.contextmanager
def legacy_tensor_types(mode: Any) -> Iterator[None]:
    """Install the stand-ins, and ``Tensor.type`` among the device mode's ``special`` handlers."""
    special = mode.special
    with contextlib.ExitStack() as stack:
        for name in NAMES:
            if hasattr(torch.cuda, name):
                stack.enter_context(patched_attr(torch.cuda, name, _stand_in(name)))
        stack.enter_context(patched_attr(torch, "set_default_tensor_type",
                                         _set_default_tensor_type(torch.set_default_tensor_type)))
        special[torch.Tensor.type] = tensor_type(mode.t.is_gpu, special[torch.Tensor.to])
        stack.callback(special.pop, torch.Tensor.type, None)
        yield
