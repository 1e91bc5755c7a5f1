"""The function mode: the virtual CUDA device as Python code sees it.

A :class:`torch.overrides.TorchFunctionMode` rewrites ``device="cuda"``, ``.cuda()``,
``.to("cuda")`` ... to the CPU and opens a :class:`~xmem_engine.tracing.scope.CallScope` for
each call, so the dispatch mode knows where the call's storages go; it makes tensors that
live "on the GPU" report ``cuda:0`` (``.device``, ``.is_cuda``), marks the backward phase,
and rewrites the kernels whose CUDA version allocates differently from the CPU's (dropout
here, ``scaled_dot_product_attention`` in ``sdpa.py``). In fake mode it answers value reads
(``.item()``, ``bool(t)``) with placeholders or :class:`NeedsRealValues`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.nn.parameter import UninitializedTensorMixin
import torch.utils._device as _device_mod
from torch.overrides import TorchFunctionMode

from xmem_engine.gpus.cuda_libraries import parse_version
from xmem_engine.tracing.kernels import einsum_lowering
from xmem_engine.tracing.shims import packed_sequences
from xmem_engine.tracing.kernels.sdpa import tracer_handler
from xmem_engine.tracing.errors import SPARSE_REASON, NeedsRealValues
from xmem_engine.tracing.frames import as_torch_error, user_frame, warning_where_torch_would
from xmem_engine.tracing.fake.placeholders import placeholder
from xmem_engine.tracing.fake.rehome import replace_buffer
from xmem_engine.tracing.scope import CPU, CallScope, Device
from xmem_engine.tracing.shims.subclasses import storage_key
from xmem_engine.tracing.symbolic import full_slices
from xmem_engine.tracing.tracer import Tracer
from xmem_engine.tracing.ops import register

_device_constructors = _device_mod._device_constructors
_T = torch.Tensor


def _metadata_reads() -> list[Any]:
    """Tensor attribute reads and metadata methods, which allocate nothing and need no call
    scope: ``generate()`` makes ~500 of them a token (``x.shape``, ``x.dtype``, ``untyped_storage()``
    in libraries' code), each through this mode. The attributes that make a view (``.T``,
    ``.mT``, ``.data``, ``.real``...) keep the general path."""
    views = {"T", "H", "mT", "mH", "data", "real", "imag", "_base"}
    reads = [d.__get__ for name, d in vars(torch._C.TensorBase).items()
             if type(d).__name__ == "getset_descriptor" and name not in views]
    methods = ("untyped_storage", "size", "stride", "dim", "numel", "storage_offset", "element_size",
               "is_contiguous", "is_floating_point", "is_complex")
    return reads + [getattr(torch._C.TensorBase, m) for m in methods if hasattr(torch._C.TensorBase, m)]


def _call(func: Any, args: tuple, kwargs: dict) -> Any:
    return func(*args, **kwargs)


def _as_device(d: Any) -> torch.device | None:
    if d is None:
        return None
    if isinstance(d, torch.device):
        return d
    if isinstance(d, int):
        return torch.device("cuda", d)
    if isinstance(d, str):
        return torch.device(d)
    return None


#: the torch functions this mode runs as CUDA would, for ``xmem ops`` (the table it dispatches
#: on is built per trace, in :class:`DeviceMode`, from the tracer's target GPU)
register("torch function", {
    "torch.nn.functional.dropout": "CUDA's fused kernel: a bool mask saved for backward",
    "torch.dropout": "CUDA's fused kernel: a bool mask saved for backward",
    "torch.nn.functional.scaled_dot_product_attention": "the backend the target GPU picks (kernels/sdpa.py)",
    "torch._pad_packed_sequence": "batch sizes kept on the host (shims/packed_sequences.py)",
    "torch.functional.einsum": "composed as releases before 2.9 compose it, for --torch 2.8 and older",
    "torch.Tensor.item": "fake mode: a placeholder number (fake/placeholders.py)",
    "torch.Tensor.__bool__": "fake mode: the known value, else a guess (fake/guesses.py)",
    "torch.Tensor.__int__": "fake mode: the known value, else a guess",
    "torch.Tensor.__index__": "fake mode: the known value, else a guess",
    "torch.Tensor.tolist": "fake mode: the known values, else guesses",
    "torch.Tensor.backward": "backward with the virtual device's phases and in-place gradient sums",
}, __name__)


class DeviceMode(TorchFunctionMode):
    """The virtual CUDA device at the Python API: device arguments, transfers, queries."""

    def __init__(self, tracer: Tracer):
        super().__init__()
        self.t = tracer
        # while compiled code runs (``torch_compile.CompiledCalls.runtime``): its ``cuda``
        # factories are Inductor's buffers, not data the user put on the GPU (category "input")
        self.compiled_code = False
        self.special: dict[Any, Callable] = dict.fromkeys(_metadata_reads(), _call)
        self.special.update({
            _T.device.__get__: self._device,
            _T.is_cuda.__get__: lambda f, a, k: self.t.is_gpu(a[0]),
            _T.is_cpu.__get__: lambda f, a, k: not self.t.is_gpu(a[0]),
            _T.get_device: lambda f, a, k: 0 if self.t.is_gpu(a[0]) else -1,
            _T.to: self._to,
            _T.cuda: self._cuda,
            _T.cpu: self._cpu,
            _T.pin_memory: lambda f, a, k: a[0],
            _T.is_pinned: lambda f, a, k: False,
            _T.numpy: self._numpy,
            torch.device: self._device_ctor,
            torch._C._nn._parse_to: self._parse_to,
            _T.backward: self._backward,
            torch.autograd.backward: self._backward,
            torch.autograd.grad: self._backward,
            torch.nn.functional.dropout: self._dropout,
            torch.dropout: self._dropout,
            # SDPA as the target GPU's backend (flash / efficient / cuDNN / math) allocates.
            torch.nn.functional.scaled_dot_product_attention: tracer_handler(tracer),
            torch._C._VariableFunctions._pad_packed_sequence: packed_sequences.handler(tracer),
        })
        target = tracer.torch_target
        if target is not None and target < einsum_lowering.SWAPPING_FROM <= parse_version():
            self.special[torch.functional.einsum] = einsum_lowering.handler(tracer.vc.autocast)
        if tracer.fake:
            self.special.update({
                _T.item: self._item,
                _T.__float__: self._item,
                _T.__format__: self._format,
                _T.__bool__: self._needs_value,
                _T.__int__: self._needs_value,
                _T.__index__: self._needs_value,
                _T.tolist: self._needs_value,
                _T.__deepcopy__: self._deepcopy,
                _T.data.__set__: self._set_data,
            })
        else:  # a number read from a tensor: its warnings at the code's line, not this mode's
            self.special.update(dict.fromkeys((_T.item, _T.__float__, _T.__int__), self._scalar))

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self.t.compiling:  # a compiler's own calls (Inductor's lazy backward compile)
            return func(*args, **kwargs)
        h = self.special.get(func)
        if h is not None:
            return h(func, args, kwargs)
        tr = self.t
        if tr.symbolic is not None and (func is _T.__getitem__ or func is _T.__setitem__):
            args = (args[0], full_slices(args[0], args[1]), *args[2:])  # symbolic.py
        if kwargs.get("pin_memory"):  # page-locked host memory needs a driver; it holds no GPU memory
            kwargs = {**kwargs, "pin_memory": False}
        dev = kwargs.get("device")
        if dev is None and _device_mod.CURRENT_DEVICE is not None and func in _device_constructors():
            # ``with torch.device("cuda")`` / ``set_default_device``: the DeviceContext sits
            # below this mode and would make a real CUDA tensor; place it here instead.
            dev = _device_mod.CURRENT_DEVICE
        target = None
        if dev is not None:
            d = _as_device(dev)
            if d is not None and d.type in ("cuda", "cpu"):
                kwargs = dict(kwargs)
                kwargs["device"] = CPU
                target = Device.GPU if d.type == "cuda" else Device.HOST
            elif d is not None and d.type == "meta":  # no memory anywhere (not the GPU's, as the input's)
                target = Device.HOST
        # Inlined Tracer.call_scope: this runs for every torch function the code calls.
        saved = tr.scope
        tr.scope = CallScope(target, target is Device.GPU and not self.compiled_code, args, None,
                             saved.category)  # a category holds inside
        try:
            out = func(*args, **kwargs)
        finally:
            tr.scope = saved
        return out

    # -- kernels that differ between the CPU and CUDA
    def _dropout(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Dropout as CUDA runs it: the fused kernel, which saves a bool mask for backward.
        The CPU kernel multiplies by a noise tensor of the input's dtype instead (a mask 4x
        larger for float32), which would inflate every dropout layer's saved activations."""
        names = ("input", "p", "training", "inplace") if func is torch.nn.functional.dropout else ("input", "p", "train")
        bound = dict(zip(names, args), **kwargs)
        x = bound["input"]
        p = bound.get("p", 0.5)
        training = bound.get("training", bound.get("train", True))
        if isinstance(x, torch.Tensor) and self.t.is_gpu(x) and training and 0.0 < p < 1.0 and x.numel() > 0:
            out = torch.native_dropout(x, p, True)[0]
            return x.copy_(out) if bound.get("inplace", False) else out
        return func(*args, **kwargs)

    # -- device queries
    def _device_ctor(self, func: Any, args: tuple, kwargs: dict) -> torch.device:
        """``torch.device(3)``: an index alone names the current accelerator's device, which
        a CPU build does not have: the virtual GPU's (FSDP's ``device_id=local_rank``)."""
        if len(args) == 1 and not kwargs and isinstance(args[0], int) and not isinstance(args[0], bool):
            return torch.device("cuda", args[0])
        return func(*args, **kwargs)

    def _parse_to(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """``module.to(local_rank)``: an index alone is a CUDA device here too."""
        if args and isinstance(args[0], int) and not isinstance(args[0], bool):
            args = (torch.device("cuda", args[0]), *args[1:])
        if isinstance(kwargs.get("device"), int) and not isinstance(kwargs["device"], bool):
            kwargs = {**kwargs, "device": torch.device("cuda", kwargs["device"])}
        return func(*args, **kwargs)

    def _device(self, func: Any, args: tuple, kwargs: dict) -> torch.device:
        return self.t.vc.device if self.t.is_gpu(args[0]) else func(*args, **kwargs)

    # -- transfers
    def _transfer(self, t: torch.Tensor, to_gpu: bool, dtype: Any, non_blocking: bool, memory_format: Any,
                  copy: bool) -> torch.Tensor:
        """``.to`` / ``.cuda()`` / ``.cpu()``: a copy when the (virtual) device changes, else
        PyTorch's own rules (no copy unless dtype or memory format change, or ``copy=True``)."""
        tr = self.t
        if isinstance(t, UninitializedTensorMixin):
            # A lazy module moved before its first forward: its (empty) placeholder moves, and
            # the parameter is later materialized where the placeholder is, as on a GPU.
            t = t.data
        src_gpu = tr.is_gpu(t)
        mf = memory_format if memory_format is not None else torch.preserve_format
        # Tensor.to itself, not a subclass's override (bitsandbytes' Params4bit.to calls
        # super().to(...), which lands here, and its own .to takes no copy= nor memory_format=).
        if src_gpu == to_gpu:
            return torch.Tensor.to(t, dtype=dtype if dtype is not None else t.dtype, non_blocking=non_blocking,
                                   copy=copy, memory_format=mf)
        if tr.fake and t.layout is not torch.strided:
            return self._sparse_transfer(t, to_gpu, dtype, non_blocking)
        with tr.call_scope(target=Device.GPU if to_gpu else Device.HOST, explicit=to_gpu and not src_gpu):
            return torch.Tensor.to(t, device=CPU, dtype=dtype, non_blocking=non_blocking, copy=True, memory_format=mf)

    def _sparse_transfer(self, t: torch.Tensor, to_gpu: bool, dtype: Any, non_blocking: bool) -> torch.Tensor:
        """A sparse tensor moved in fake mode: its indices and values moved as the dense tensors
        they are, the sparse tensor made again of them (FakeTensorMode's own copy of a sparse
        tensor has no entries: a graph's adjacency took no memory)."""
        if t.layout is not torch.sparse_coo:
            raise NeedsRealValues(f"Tensor.to of a {t.layout} tensor", SPARSE_REASON, user_frame(4))
        values = self._transfer(t._values(), to_gpu, dtype, non_blocking, None, False)
        indices = self._transfer(t._indices(), to_gpu, None, non_blocking, None, False)
        return torch.sparse_coo_tensor(indices, values, t.shape, is_coalesced=t.is_coalesced())

    def _to(self, func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
        t, rest = args[0], args[1:]
        kwargs = dict(kwargs)
        copy = bool(kwargs.pop("copy", False))
        if len(rest) >= 4 and not isinstance(rest[0], torch.Tensor):  # to(device, dtype, non_blocking, copy)
            copy = copy or bool(rest[3])
            rest = rest[:3]
        elif len(rest) >= 3 and isinstance(rest[0], torch.dtype):  # to(dtype, non_blocking, copy)
            copy = copy or bool(rest[2])
            rest = rest[:2]
        if rest and isinstance(rest[0], torch.Tensor):
            other = rest[0]
            device = self.t.vc.device if self.t.is_gpu(other) else other.device
            dtype = other.dtype
            non_blocking = bool(rest[1]) if len(rest) > 1 else kwargs.get("non_blocking", False)
            memory_format = kwargs.get("memory_format")
        else:
            device, dtype, non_blocking, memory_format = self._parse_to(torch._C._nn._parse_to, rest, kwargs)
        if device is None or device.type not in ("cuda", "cpu"):
            if device is None:
                return self._transfer(t, self.t.is_gpu(t), dtype, non_blocking, memory_format, copy)
            if device.type == "meta":  # accelerate's offload hooks put a layer's weights back there
                with self.t.call_scope(target=Device.HOST):
                    return func(*args, **kwargs)
            return func(*args, **kwargs)
        return self._transfer(t, device.type == "cuda", dtype, non_blocking, memory_format, copy)

    def _cuda(self, func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
        non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
        return self._transfer(args[0], True, None, non_blocking, kwargs.get("memory_format"), False)

    def _cpu(self, func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
        return self._transfer(args[0], False, None, False, kwargs.get("memory_format"), False)

    def _numpy(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if self.t.is_gpu(args[0]):
            raise as_torch_error(TypeError(
                "can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first."
            ))
        from torch._subclasses.fake_tensor import FakeTensor

        if isinstance(args[0], FakeTensor):  # a big host tensor left fake: its values are guessed
            try:
                return self.t.guesses.read("Tensor.numpy()", lambda r: r.numpy(*args[1:], **kwargs).copy(), args[0])
            except NeedsRealValues:  # too big for a surrogate: zeros, which cost the host nothing until written
                return self.t.guesses.host_array("Tensor.numpy() of a large tensor", args[0])
        return func(*args, **kwargs)

    # -- phases
    def _backward(self, func: Any, args: tuple, kwargs: dict) -> Any:
        at = 4 if func is torch.autograd.grad else 3  # (outputs, inputs, grad_outputs, retain_graph, create_graph)
        create_graph = bool(kwargs.get("create_graph", args[at] if len(args) > at else False))
        with self.t.backward_phase(create_graph):
            return func(*args, **kwargs)

    def on_stack(self) -> bool:
        """This mode is on the torch-function stack (not inside its own handler)."""
        n = torch._C._len_torch_function_stack()
        return any(torch._C._get_function_stack_at(i) is self for i in range(n))

    def in_backward_engine(self, run_backward: Callable[..., Any], raised: Callable[[], None]) -> Callable[..., Any]:
        """autograd's engine (``torch.autograd._engine_run_backward``) with this mode back on:
        ``backward()`` reaches the engine from inside this mode's handler, where the mode is
        off, and the Python code that backward runs (FSDP's unshard and reduce-scatter hooks,
        custom Functions' backward, a checkpoint's recomputation) must see the virtual device
        as forward did. The dispatch mode takes it off again for the aten ops (``AllocMode``).
        ``raised`` is called when a backward raises (an out-of-memory error), before the error
        reaches the user's code: the tracer lets go of the graph it ran on. The engine's run is
        the backward phase also where ``backward()`` was called with this mode off (in a function
        compiled whole, Dynamo calls it eagerly at a graph break)."""

        def run(*args: Any, **kwargs: Any) -> Any:
            # (outputs, grad_outputs, retain_graph, create_graph, inputs, ...), as torch calls it
            create_graph = bool(args[3] if len(args) > 3 else kwargs.get("create_graph", False))
            try:
                with self.t.backward_phase(create_graph):
                    if self.on_stack():
                        return run_backward(*args, **kwargs)
                    with self:
                        return run_backward(*args, **kwargs)
            except BaseException:
                raised()
                raise

        run.__wrapped__ = run_backward  # type: ignore[attr-defined]
        return run

    # -- values
    def _scalar(self, func: Any, args: tuple, kwargs: dict) -> Any:
        return warning_where_torch_would(lambda: func(*args, **kwargs))

    def _item(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """A number that may be logged freely; its use in control flow is a noted guess."""
        g = self.t.guesses
        g.defer += 1
        try:
            return warning_where_torch_would(lambda: func(*args, **kwargs))
        except NeedsRealValues:  # (float() of an integer or bool tensor is a float, as torch's is)
            dtype = torch.float64 if func is _T.__float__ and not args[0].dtype.is_floating_point else args[0].dtype
            return placeholder(dtype, g.scalar(args[0]), g.decide)
        finally:
            g.defer -= 1

    def _format(self, func: Any, args: tuple, kwargs: dict) -> str:
        t = args[0]
        if t.dim() != 0:
            return func(*args, **kwargs)
        return format(self._item(_T.item, (t,), {}), *args[1:], **kwargs)

    def _set_data(self, func: Any, args: tuple, kwargs: dict) -> None:
        """``buf.data = buf.to("cuda")`` on a real host buffer (FSDP's way of moving buffers):
        the fake GPU tensor replaces it in its modules (``fake/rehome.py``)."""
        from torch._subclasses.fake_tensor import FakeTensor

        t, value = args
        if (isinstance(value, FakeTensor) and not isinstance(t, (FakeTensor, torch.nn.Parameter))
                and replace_buffer(t, value)):
            return None
        return func(*args, **kwargs)

    def _deepcopy(self, func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
        """``copy.deepcopy`` of a fake tensor (``nn.TransformerEncoder`` clones its layer):
        torch's storage-level copy leaves fake tensors whose views get storages of their
        own; a clone is the same allocation with sane aliasing."""
        from torch._subclasses.fake_tensor import FakeTensor

        t, memo = args[0], (args[1] if len(args) > 1 else kwargs.get("memo"))
        if not isinstance(t, FakeTensor) or memo is None:
            return func(*args, **kwargs)
        if id(t) in memo:
            return memo[id(t)]
        import copy

        with torch.no_grad():
            new = t.detach().clone(memory_format=torch.preserve_format)
        if isinstance(t, torch.nn.Parameter) or getattr(t, "_is_param", False):
            new = torch.nn.Parameter(new, t.requires_grad)
        elif t.requires_grad and t.is_leaf:
            new.requires_grad_(True)
        memo[id(t)] = new
        if t.grad is not None:
            new.grad = copy.deepcopy(t.grad, memo)
        for k, v in vars(t).items():
            if not hasattr(new, k):
                setattr(new, k, copy.deepcopy(v, memo))
        return new

    def _needs_value(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """``bool(t)``, ``int(t)``, ``t.tolist()``...: the known value, else a noted guess."""
        g = self.t.guesses
        g.defer += 1
        try:
            return warning_where_torch_would(lambda: func(*args, **kwargs))
        except NeedsRealValues:
            name = getattr(func, "__name__", str(func))
            what, read = _VALUE_READS.get(name, (f"Tensor.{name}", func))
            return g.read(what, read, args[0])  # NeedsRealValues for a big tensor, or a loop
        finally:
            g.defer -= 1


_VALUE_READS: dict[str, tuple[str, Callable[[torch.Tensor], Any]]] = {
    "__bool__": ("bool(tensor)", bool),
    "__int__": ("int(tensor)", int),
    "__index__": ("a tensor used as an index", lambda r: r.__index__()),
    "tolist": ("tensor.tolist()", lambda r: r.tolist()),
}


def fake_device_property(tracer: Tracer, mode: DeviceMode) -> property:
    """``FakeTensor.device`` is a Python property, invisible to TorchFunctionMode: report the
    virtual GPU (``cuda:LOCAL_RANK``) for GPU storages, but only to code running under the
    device mode (user and library Python code), never to FakeTensorMode's own kernels."""
    from torch._subclasses.fake_tensor import FakeTensor

    orig = vars(FakeTensor)["device"]
    fake_key = torch._C._TorchDispatchModeKey.FAKE

    def device(t: torch.Tensor) -> torch.device:
        d = orig.fget(t)
        if tracer.in_dynamo and d.type == "cpu" and tracer.is_gpu(t):
            return tracer.vc.device  # Dynamo makes its fake tensors on cuda (torch_compile.py)
        # Inside FakeTensorMode's handler its mode is off the stack: its kernels are asking,
        # for an op called with the device mode still on (``torch.ops.fsdp.*``, C++ code).
        # (the storage asked last: a sparse tensor's is its values', read through FakeTensorMode)
        if (d.type == "cpu" and torch._C._get_dispatch_mode(fake_key) is not None and mode.on_stack()
                and storage_key(t) in tracer.live):
            return tracer.vc.device
        return d

    return property(device, orig.fset)
