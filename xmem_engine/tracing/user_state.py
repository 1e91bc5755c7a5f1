"""Keep tracing non-intrusive: snapshot the user's objects before, restore them after.

Traced code may move a model the user built earlier (``model.cuda()`` rebinds parameter
data, under fake tensors it even swaps in fake ones), step an optimizer, toggle
``requires_grad`` or reseed the RNG. :class:`UserState` records what such code could change
on the modules, optimizers and tensors reachable from the user's namespace (and, for a
callable, from its globals and closure) and puts all of it back afterwards; so too the
process-wide things a cell or script may change for its own run: the working directory,
``os.environ``, the global RNGs and the user's own generator objects (``torch.Generator``,
numpy's ``Generator`` / ``RandomState``, ``random.Random``), and common torch settings.
"""

from __future__ import annotations

import functools
import io
import os
import random
import types
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from xmem_engine.tracing.frames import is_user_file

_MAX_DEPTH = 8  # how far into containers / object attributes the search for user objects goes
_MAX_ITEMS = 20_000


@dataclass
class _TensorState:
    tensor: torch.Tensor
    data: torch.Tensor  # a detached alias: storage, sizes, strides, dtype as they were
    requires_grad: bool
    grad: torch.Tensor | None


@dataclass
class _ModuleState:
    module: torch.nn.Module
    attrs: dict
    params: dict
    buffers: dict
    modules: dict


@dataclass
class _OptimizerState:
    optimizer: torch.optim.Optimizer
    attrs: dict
    state: dict
    param_groups: list


@dataclass
class UserState:
    """What traced code could change in the user's objects, to be restored afterwards."""

    tensors: list[_TensorState] = field(default_factory=list)
    modules: list[_ModuleState] = field(default_factory=list)
    optimizers: list[_OptimizerState] = field(default_factory=list)
    rng: tuple = ()
    settings: dict = field(default_factory=dict)
    # The user's storages, by storage key, and copies of those the traced code is about to
    # write to (copy on first write; see :meth:`before_write`).
    storages: dict[int, torch.UntypedStorage] = field(default_factory=dict)
    # The user's lists, dicts and sets with a shallow copy (traced code may append to them).
    containers: list[tuple[Any, Any]] = field(default_factory=list)
    originals: dict[int, torch.UntypedStorage] = field(default_factory=dict)
    # The user's numpy arrays as (first byte, end, array): ``torch.from_numpy`` tensors share
    # their memory, so an in-place op of the traced code would write into them. Copied on
    # first write, put back afterwards.
    arrays: list[tuple[int, int, Any]] = field(default_factory=list)
    array_originals: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    watching: bool = False  # anything to copy on write (read by the dispatch mode on every op)
    # The user's own generator objects with their states (``_generator_state``).
    generators: list[tuple[Any, Any]] = field(default_factory=list)
    cwd: str | None = None
    environ: dict[str, str] = field(default_factory=dict)

    @classmethod
    def capture(cls, roots: Iterable[Any]) -> "UserState":
        """Snapshot everything reachable from ``roots`` (values are copied lazily, on first write)."""
        st = cls()
        modules, optimizers, tensors, containers, arrays, generators = _find(roots)
        st.generators = [(g, _generator_state(g)) for g in generators]
        st.environ = dict(os.environ)
        try:
            st.cwd = os.getcwd()
        except OSError:  # the folder was removed under us: nothing to go back to
            st.cwd = None
        st.containers = [(c, c.copy()) for c in containers]
        for a in arrays:
            if a.flags.writeable and a.nbytes:
                start = a.__array_interface__["data"][0]
                st.arrays.append((start, start + a.nbytes, a))
        seen_tensors: dict[int, torch.Tensor] = {id(t): t for t in tensors}
        for m in modules:
            for sub in m.modules():
                st.modules.append(
                    _ModuleState(sub, dict(sub.__dict__), dict(sub._parameters), dict(sub._buffers), dict(sub._modules))
                )
                for t in list(sub._parameters.values()) + list(sub._buffers.values()):
                    if t is not None:
                        seen_tensors.setdefault(id(t), t)
        for opt in optimizers:
            st.optimizers.append(
                _OptimizerState(
                    opt,
                    dict(opt.__dict__),
                    {k: dict(v) if isinstance(v, dict) else v for k, v in opt.state.items()},
                    [dict(g) for g in opt.param_groups],
                )
            )
            for g in opt.param_groups:
                for p in g["params"]:
                    seen_tensors.setdefault(id(p), p)
            for s in opt.state.values():
                for v in (s.values() if isinstance(s, dict) else ()):
                    if isinstance(v, torch.Tensor):
                        seen_tensors.setdefault(id(v), v)
        for t in list(seen_tensors.values()):
            if t.grad is not None:
                seen_tensors.setdefault(id(t.grad), t.grad)
        with torch.no_grad():
            for t in seen_tensors.values():
                st.tensors.append(_TensorState(t, t.detach(), t.requires_grad, t.grad))
                if not t.is_meta:
                    storage = t.untyped_storage()
                    st.storages[storage._cdata] = storage
        st.rng = _rng_state()
        st.settings = _settings()
        st.watching = bool(st.storages or st.arrays)
        return st

    def restore(self) -> None:
        """Put back every recorded attribute, container, tensor binding, flag and RNG state."""
        for container, saved in self.containers:
            if isinstance(container, list):
                if len(container) != len(saved) or any(a is not b for a, b in zip(container, saved)):
                    container[:] = saved
            else:
                container.clear()
                container.update(saved)
        for ms in self.modules:
            d = ms.module.__dict__
            for store, saved in ((ms.module._parameters, ms.params), (ms.module._buffers, ms.buffers),
                                 (ms.module._modules, ms.modules)):
                store.clear()
                store.update(saved)
            for k in [k for k in d if k not in ms.attrs]:
                del d[k]
            for k, v in ms.attrs.items():
                if d.get(k, _MISSING) is not v:
                    d[k] = v
        for os_ in self.optimizers:
            opt = os_.optimizer
            d = opt.__dict__
            for k in [k for k in d if k not in os_.attrs]:
                del d[k]
            d.update(os_.attrs)
            opt.state.clear()
            opt.state.update(os_.state)
            for g, saved in zip(opt.param_groups, os_.param_groups):
                g.clear()
                g.update(saved)
        with torch.no_grad():
            for ts in self.tensors:
                t = ts.tensor
                if not _same_binding(t, ts.data):
                    t.data = ts.data
                if t.is_leaf and t.requires_grad != ts.requires_grad:
                    t.requires_grad_(ts.requires_grad)
                if t.grad is not ts.grad:
                    t.grad = ts.grad
            for key, original in self.originals.items():
                self.storages[key].copy_(original)
        self.originals.clear()
        if self.array_originals:
            import numpy as np

            for arr, saved in self.array_originals.values():
                np.copyto(arr, saved)
            self.array_originals.clear()
        _set_rng_state(self.rng)
        for g, state in self.generators:
            _set_generator_state(g, state)
        _restore_settings(self.settings)
        _restore_environ(self.environ)
        if self.cwd is not None:
            try:
                if os.getcwd() != self.cwd:
                    os.chdir(self.cwd)
            except OSError:
                os.chdir(self.cwd)

    def before_write(self, t: torch.Tensor) -> None:
        """``t`` is about to be written in place: keep a copy if it is (a view of) the user's data."""
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self.storages and key not in self.originals:
            from torch.utils._python_dispatch import _disable_current_modes

            with _disable_current_modes():  # a real copy, not a fake one, and not traced
                self.originals[key] = storage.clone()
        elif self.arrays and storage.device.type == "cpu":  # fake tensors have meta storages
            ptr = storage.data_ptr()
            for start, end, arr in self.arrays:
                if start <= ptr < end and id(arr) not in self.array_originals:
                    self.array_originals[id(arr)] = (arr, arr.copy())


_SDP = ("flash", "mem_efficient", "math", "cudnn")
_PRINT = ("precision", "threshold", "edgeitems", "linewidth", "sci_mode")
_SETTINGS = (
    # First, through its public setter: it sets the TF32 flags below consistently. Writing the
    # legacy ``allow_tf32`` flag over a precision set with the new API leaves torch in a mixed
    # state where ``get_float32_matmul_precision()`` raises (issue #36).
    ("matmul_precision", torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    ("cudnn.benchmark", lambda: torch.backends.cudnn.benchmark,
     lambda v: setattr(torch.backends.cudnn, "benchmark", v)),
    ("cudnn.deterministic", lambda: torch.backends.cudnn.deterministic,
     lambda v: setattr(torch.backends.cudnn, "deterministic", v)),
    ("cudnn.enabled", lambda: torch.backends.cudnn.enabled, lambda v: setattr(torch.backends.cudnn, "enabled", v)),
    ("cuda.matmul.allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32,
     lambda v: setattr(torch.backends.cuda.matmul, "allow_tf32", v)),
    ("cudnn.allow_tf32", lambda: torch.backends.cudnn.allow_tf32,
     lambda v: setattr(torch.backends.cudnn, "allow_tf32", v)),
    ("cuda.matmul.allow_fp16_reduced_precision_reduction",
     lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
     lambda v: setattr(torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction", v)),
    ("cuda.matmul.allow_bf16_reduced_precision_reduction",
     lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
     lambda v: setattr(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction", v)),
    ("anomaly", lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
     lambda v: torch.set_anomaly_enabled(*v)),
    ("print_options", lambda: tuple(getattr(torch._tensor_str.PRINT_OPTS, k) for k in _PRINT),
     lambda v: torch.set_printoptions(**dict(zip(_PRINT, v)))),
    ("default_dtype", torch.get_default_dtype, torch.set_default_dtype),
    ("deterministic", torch.are_deterministic_algorithms_enabled, torch.use_deterministic_algorithms),
    ("grad_enabled", torch.is_grad_enabled, torch.set_grad_enabled),
    ("num_threads", torch.get_num_threads, torch.set_num_threads),
    # SDPA backend switches (torch.backends.cuda.enable_*_sdp, sdpa_kernel): the tracer reads them.
    ("cuda.sdp_enabled", lambda: tuple(getattr(torch.backends.cuda, f"{n}_sdp_enabled")() for n in _SDP),
     lambda v: [getattr(torch.backends.cuda, f"enable_{n}_sdp")(x) for n, x in zip(_SDP, v)]),
    ("cuda.sdp_priority_order", lambda: tuple(torch._C._get_sdp_priority_order()),
     lambda v: torch._C._set_sdp_priority_order(list(v))),
)


def _settings() -> dict:
    """Process-wide torch settings user code commonly changes."""
    out = {}
    for name, get, _ in _SETTINGS:
        try:
            out[name] = get()
        except (RuntimeError, AttributeError):  # pragma: no cover - backend without the flag
            pass
    return out


def _restore_settings(saved: dict) -> None:
    for name, get, set_ in _SETTINGS:
        if name not in saved:
            continue
        try:
            same = get() == saved[name]
        except (RuntimeError, AttributeError):  # a state the getter refuses (mixed TF32 APIs): set it
            same = False
        if not same:
            try:
                set_(saved[name])
            except (RuntimeError, AttributeError):  # pragma: no cover
                pass


_MISSING = object()


def _same_binding(t: torch.Tensor, alias: torch.Tensor) -> bool:
    return (
        t.untyped_storage()._cdata == alias.untyped_storage()._cdata
        and t.shape == alias.shape
        and t.stride() == alias.stride()
        and t.storage_offset() == alias.storage_offset()
        and t.dtype == alias.dtype
    )


def _find(roots: Iterable[Any]) -> tuple[list[torch.nn.Module], list[torch.optim.Optimizer], list[torch.Tensor],
                                         list[list | dict | set], list[Any], list[Any]]:
    """Modules, optimizers, tensors, mutable containers, numpy arrays and generator objects
    reachable from ``roots`` through containers and attributes."""
    generators: dict[int, Any] = {}
    arrays: dict[int, Any] = {}
    containers: dict[int, list | dict | set] = {}
    modules: dict[int, torch.nn.Module] = {}
    optimizers: dict[int, torch.optim.Optimizer] = {}
    tensors: dict[int, torch.Tensor] = {}
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(r, 0) for r in roots]
    while stack and len(seen) < _MAX_ITEMS:
        obj, depth = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if _is_environment(obj):
            continue
        if isinstance(obj, torch.nn.Module):
            modules[id(obj)] = obj
        elif isinstance(obj, torch.optim.Optimizer):
            optimizers[id(obj)] = obj
        elif isinstance(obj, torch.Tensor):
            tensors[id(obj)] = obj
        elif type(obj).__name__ == "ndarray" and type(obj).__module__ == "numpy":
            arrays[id(obj)] = obj
        elif _is_generator(obj):
            generators[id(obj)] = obj
        elif depth < _MAX_DEPTH:
            if type(obj) in (list, dict, set) or isinstance(obj, (list, dict, set)) and type(obj).__module__ == "collections":
                containers[id(obj)] = obj
            stack.extend((v, depth + 1) for v in _reachable(obj))
    return (list(modules.values()), list(optimizers.values()), list(tensors.values()), list(containers.values()),
            list(arrays.values()), list(generators.values()))


# Packages whose objects are the notebook's machinery, never the user's: the namespace holds
# ``get_ipython``, ``exit`` and ``quit``, which reach the shell, its output streams and its
# history. Restoring their lists and dicts dropped what a cell printed (issue #35: ``print``
# in a ``%%xmem`` cell was lost in 4 of 6 runs) and rewound the history database's counters.
_ENVIRONMENT_PACKAGES = frozenset({
    "IPython", "ipykernel", "traitlets", "zmq", "jupyter_client", "jupyter_core", "tornado", "comm",
    "ipywidgets", "prompt_toolkit", "asyncio", "xmem_jupyter",
})


def _is_environment(obj: Any) -> bool:
    """An object of the interactive shell (or an I/O stream): not searched, never restored."""
    if isinstance(obj, io.IOBase):
        return True
    if isinstance(obj, types.MethodType):
        obj = obj.__self__
    mod = type(obj).__module__ or ""
    return mod.partition(".")[0] in _ENVIRONMENT_PACKAGES


def _reachable(obj: Any) -> list[Any]:
    """What user code can reach from ``obj``: container items; an object's attributes, its
    ``__slots__`` too (a callable object's as well); a partial's function and arguments; a
    user function's closure, defaults and the globals it names (a training step that reaches
    the model through a module-level name); a bound method's object."""
    if isinstance(obj, dict):
        return list(obj.values())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return list(obj)
    if isinstance(obj, (type, types.ModuleType, str, bytes, int, float, complex)):
        return []
    if isinstance(obj, functools.partial):
        return [obj.func, *obj.args, *obj.keywords.values()]
    if isinstance(obj, types.MethodType):
        return [obj.__self__, obj.__func__]
    if isinstance(obj, types.FunctionType):
        if not is_user_file(obj.__code__.co_filename):
            return []  # a library's function: its module's globals are not the user's objects
        g = obj.__globals__
        return ([g[n] for n in obj.__code__.co_names if n in g and not n.startswith("__")]
                + [c.cell_contents for c in (obj.__closure__ or ()) if _cell_has(c)]
                + list(obj.__defaults__ or ()) + list((obj.__kwdefaults__ or {}).values()))
    out = list(vars(obj).values()) if hasattr(obj, "__dict__") else []
    for cls in type(obj).__mro__:
        for slot in getattr(cls, "__slots__", ()) if not isinstance(getattr(cls, "__slots__", ()), str) else (
                cls.__slots__,):
            if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                out.append(getattr(obj, slot))
    return out


def _cell_has(c: types.CellType) -> bool:
    try:
        c.cell_contents
    except ValueError:
        return False
    return True


def _rng_state() -> tuple:
    np_state = None
    try:
        import numpy as np

        np_state = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    return (torch.get_rng_state(), random.getstate(), np_state)


def _set_rng_state(state: tuple) -> None:
    if not state:
        return
    torch_state, py_state, np_state = state
    torch.set_rng_state(torch_state)
    random.setstate(py_state)
    if np_state is not None:
        import numpy as np

        np.random.set_state(np_state)


def _is_generator(obj: Any) -> bool:
    if isinstance(obj, (torch.Generator, random.Random)):
        return True
    cls = type(obj)
    return cls.__module__.startswith("numpy.random") and cls.__name__ in ("Generator", "RandomState")


def _generator_state(g: Any) -> Any:
    if isinstance(g, torch.Generator):
        return g.get_state()
    if isinstance(g, random.Random):
        return g.getstate()
    if type(g).__name__ == "RandomState":
        return g.get_state()
    return g.bit_generator.state  # numpy's Generator


def _set_generator_state(g: Any, state: Any) -> None:
    if isinstance(g, torch.Generator):
        g.set_state(state)
    elif isinstance(g, random.Random):
        g.setstate(state)
    elif type(g).__name__ == "RandomState":
        g.set_state(state)
    else:
        g.bit_generator.state = state


def _restore_environ(saved: dict[str, str]) -> None:
    """``os.environ`` as it was, through ``os.environ`` itself (so the C environment follows)."""
    for k in [k for k in os.environ if k not in saved]:
        del os.environ[k]
    for k, v in saved.items():
        if os.environ.get(k) != v:
            os.environ[k] = v


_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def is_plain(v: Any, depth: int = 0) -> bool:
    """A value the traced code may hand back to the caller's namespace: numbers, strings and
    containers of them (no tensors, no modules)."""
    if type(v) in _PLAIN:
        return True
    if depth > 4:
        return False
    if type(v) in (list, tuple, set, frozenset):
        return len(v) <= 100_000 and all(is_plain(x, depth + 1) for x in v)
    if type(v) is dict:
        return len(v) <= 100_000 and all(is_plain(k, depth + 1) and is_plain(x, depth + 1) for k, x in v.items())
    return False
