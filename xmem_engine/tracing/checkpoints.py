"""``torch.save`` and ``torch.load`` of fake tensors: checkpoints kept in memory, not written.

Why: training loops save the best model as they go (``torch.save(model.state_dict(), path)``)
and sometimes load it back at the end. Fake tensors have no values to write (pickling one
fails), and a checkpoint of a 7B model would be 28 GB of zeros on the user's disk. On a GPU
``torch.save`` copies each tensor to the host and allocates nothing on the device; so in fake
mode a save whose object holds fake tensors writes nothing and keeps the object, and a later
``torch.load`` of the same path (or file object) in the traced code returns a copy, whose
tensors are new storages where ``map_location`` puts them, as a real load's are. Objects
without fake tensors are saved and loaded by torch as usual. Each kept save is noted.

In both modes, a load puts tensors on the virtual GPU where a GPU run would: a
``map_location`` of ``cuda``, or none for a checkpoint saved from the GPU (in this trace, or
with ``cuda`` storages in the file). torch itself would refuse: this machine has no CUDA.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import pickle
from typing import Any, Iterator

import torch

from xmem_engine.tracing.frames import user_frame
from xmem_engine.tracing.patches import patched_attr


class _TensorFinder(pickle.Pickler):
    """Walks what ``pickle`` would walk (modules, optimizers, nested containers), collecting
    tensors instead of writing them."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors: list[torch.Tensor] = []

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            self.tensors.append(obj)
            return len(self.tensors)
        return None


def _tensors(obj: Any) -> list[torch.Tensor] | None:
    finder = _TensorFinder()
    try:
        finder.dump(obj)
    except Exception:  # something torch.save could not write either: let it say so
        return None
    return finder.tensors


def _key(f: Any) -> Any:
    if isinstance(f, (str, os.PathLike)):
        return os.path.abspath(os.fspath(f))
    return id(f)


class _Found(Exception):
    pass


class _LocationReader(pickle.Unpickler):
    """Reads a checkpoint's ``data.pkl`` up to its first storage, whose location tag
    (``"cuda:0"``, ``"cpu"``) it reports; classes resolve to a harmless stand-in, so nothing
    of the file's code runs."""

    def persistent_load(self, pid: Any) -> Any:
        raise _Found(pid[3] if isinstance(pid, tuple) and len(pid) > 3 else None)

    def find_class(self, module: str, name: str) -> Any:
        return lambda *a, **k: None


def _first_location(f: Any) -> str | None:
    """Where a checkpoint's first storage was saved from, without reading tensor data."""
    import zipfile

    pos = None
    try:
        if not isinstance(f, (str, os.PathLike)):
            pos = f.tell()
        with zipfile.ZipFile(f) as z:
            name = next((n for n in z.namelist() if n.endswith("data.pkl")), None)
            if name is None:
                return None
            try:
                _LocationReader(io.BytesIO(z.read(name))).load()
            except _Found as found:
                return found.args[0]
    except Exception:  # not a zip checkpoint (the legacy format): torch.load decides
        return None
    finally:
        if pos is not None:
            f.seek(pos)
    return None


def _to_host(location: Any) -> bool | None:
    """True for a ``map_location`` that means the host, False for CUDA, None otherwise."""
    if isinstance(location, str):
        location = torch.device(location)
    if isinstance(location, torch.device):
        return location.type == "cpu"
    return None


class Checkpoints:
    """The checkpoints one fake-mode trace saved: by absolute path, or by file object."""

    def __init__(self, tracer: Any):
        self.tracer = tracer
        self.kept: dict[Any, tuple[Any, Any]] = {}  # key -> (object, the file object kept alive)
        self.gpu_saved: dict[Any, bool] = {}  # key -> its tensors were on the virtual GPU

    def save(self, orig: Any) -> Any:
        from torch._subclasses.fake_tensor import FakeTensor

        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
            tensors = _tensors(obj)
            if not tensors or not any(isinstance(t, FakeTensor) for t in tensors):
                self.gpu_saved[_key(f)] = any(self.tracer.is_gpu(t) for t in tensors or ())
                return orig(obj, f, *args, **kwargs)
            self.kept[_key(f)] = (obj, None if isinstance(f, (str, os.PathLike)) else f)
            where = user_frame(2)
            note = (f"torch.save{' at ' + where if where else ''} wrote nothing: fake tensors have no values "
                    "(a torch.load of it in the traced code returns a copy)")
            if note not in self.tracer.notes:
                self.tracer.notes.append(note)

        return save

    def load(self, orig: Any) -> Any:
        def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
            key = _key(f)
            kept = self.kept.get(key)
            if kept is not None:
                return self._copy(kept[0], map_location)
            to_gpu = _to_host(map_location) is False
            if not to_gpu and map_location is not None:
                return orig(f, map_location, *args, **kwargs)
            saved_on = _first_location(f) if map_location is None else None
            obj = orig(f, "cpu", *args, **kwargs)  # in fake mode: fake tensors, no data read
            if to_gpu or self.gpu_saved.get(key) or (saved_on or "").startswith("cuda"):
                return self._copy(obj, "cuda")
            return obj

        return load

    def _copy(self, obj: Any, map_location: Any) -> Any:
        """A copy of ``obj`` whose tensors are new storages: on the host for a CPU
        ``map_location``, on the virtual GPU for a CUDA one, where they were otherwise."""
        host = _to_host(map_location)
        memo: dict[int, Any] = {}
        with torch.no_grad():
            for t in _tensors(obj) or ():
                if id(t) in memo:
                    continue
                to_host = host if host is not None else not self.tracer.is_gpu(t)
                new = t.detach().to("cpu" if to_host else "cuda", copy=True)
                if isinstance(t, torch.nn.Parameter):
                    new = torch.nn.Parameter(new, t.requires_grad)
                memo[id(t)] = new
        return copy.deepcopy(obj, memo)


@contextlib.contextmanager
def kept_in_memory(tracer: Any) -> Iterator[Checkpoints]:
    """Fake mode: ``torch.save`` / ``torch.load`` as described above, for the duration."""
    cp = Checkpoints(tracer)
    import torch.serialization as ser

    with contextlib.ExitStack() as stack:
        save, load = cp.save(ser.save), cp.load(ser.load)
        for mod in (torch, ser):
            stack.enter_context(patched_attr(mod, "save", save))
            stack.enter_context(patched_attr(mod, "load", load))
        yield cp
