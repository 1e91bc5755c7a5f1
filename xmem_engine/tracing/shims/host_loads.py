"""``torch.load`` of a real file to the host, in fake mode: the values a host reads, known.

Why: under a fake mode torch reads no tensor data (its storages are made on ``meta``); under
xmem's modes the tensors it rebuilt on them stayed plain meta tensors, not fake ones. Any value
read of one then failed ("Tensor.item() cannot be called on meta tensors"): a checkpoint's step
count, a ``torch.set_rng_state`` of a saved RNG state, and torch.distributed.checkpoint's load,
which copies each entry it reads to the host into the tensor it fills (a real one for a step
count: "Cannot copy out of meta tensor").

How: the file is read again without the fake mode, memory-mapped where it is a path (so only
what is read costs host memory), and each tensor is taken as a real host tensor while the
budget of host values lasts (small ones: counts, RNG states, a small model), and as a fake host
tensor over the same storage layout beyond (the weights of a large pretrained checkpoint: no
values, no host memory). A file torch cannot read that way (an old format that cannot be
mapped, and too large to read whole) keeps fake tensors throughout.
"""

from __future__ import annotations

import copy
import io
import os
import pickle
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

from xmem_engine.tracing.fake.fake_fastpaths import fake_empty


def _nbytes(ts: list[torch.Tensor]) -> int:
    return sum({t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in ts}.values())


def with_host_values(obj: Any, *, reread: Callable[[bool], Any] | None, tensors: Callable[[Any], list | None],
                     mode: Any, room: Callable[[], int], spend: Callable[[int], None], mmap: bool) -> Any:
    """``obj`` (what torch.load gave under the fake mode) with its meta tensors replaced: real
    host tensors while ``room()`` bytes are left of the budget (each ``spend``s it), fake host
    tensors after. ``reread(mmap)`` loads the same file again, for real."""
    if mode is None:  # real mode: torch read the values
        return obj
    found = tensors(obj) or []
    metas = [t for t in found if t.device.type == "meta" and not isinstance(t, FakeTensor)]
    if not metas:
        return obj
    real = None
    for mapped in ((True, False) if mmap else (False,)) if reread is not None else ():
        if not mapped and _nbytes(metas) > room():
            break
        try:
            with unset_fake_temporarily():
                real = reread(mapped)
            break
        except Exception:  # noqa: BLE001 - a file torch cannot map (the legacy format) or read again
            real = None
    reals = tensors(real) if real is not None else None
    if reals is None or len(reals) != len(found):
        reals, real = found, obj  # fake tensors in the meta tensors' layout
    memo: dict[int, Any] = {}
    by_storage: dict[int, torch.Tensor] = {}  # a storage's replacement (real copy or fake bytes): aliases stay aliases
    for t in reals:
        st = t.untyped_storage()
        base = by_storage.get(st._cdata)
        if base is None:
            n = st.nbytes()
            if t.device.type != "meta" and n <= room():
                spend(n)
                with unset_fake_temporarily(), torch._C._DisableTorchDispatch(), torch._C.DisableTorchFunction():
                    base = torch.empty(n, dtype=torch.uint8)
                    base.untyped_storage().copy_(st)  # off the file's mapping: the file may change later
            else:
                base = fake_empty(mode, (n,), None, torch.uint8, torch.device("cpu"))
            by_storage[st._cdata] = base
        with torch.no_grad():
            if isinstance(base, FakeTensor):
                new = base.view(t.dtype).as_strided(t.shape, t.stride(), t.storage_offset())
            else:
                with torch._C._DisableTorchDispatch(), torch._C.DisableTorchFunction():
                    new = torch.empty(0, dtype=t.dtype).set_(base.untyped_storage(), t.storage_offset(), t.shape, t.stride())
        memo[id(t)] = torch.nn.Parameter(new, t.requires_grad) if isinstance(t, torch.nn.Parameter) \
            else new.requires_grad_(t.requires_grad)
    return copy.deepcopy(real, memo)


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


def first_location(f: Any) -> str | None:
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


def file_position(f: Any) -> int | None:
    """Where a file object is, to read it again from there; None for a path."""
    if isinstance(f, (str, os.PathLike)):
        return None
    try:
        return f.tell()
    except Exception:  # noqa: BLE001 - a stream that cannot tell cannot be read twice
        return -1


class _WhereTo:
    """A storage stand-in for a ``map_location`` function: records where the function sends it."""

    def __init__(self) -> None:
        self.where = "cpu"  # torch hands the function a storage already read to the host

    def cuda(self, *args: Any, **kwargs: Any) -> "_WhereTo":
        self.where = "cuda"
        return self

    def cpu(self) -> "_WhereTo":
        self.where = "cpu"
        return self

    def to(self, device: Any = None, *args: Any, **kwargs: Any) -> "_WhereTo":
        if device is not None:
            self.where = torch.device(device).type
        return self


def resolved_location(map_location: Any, f: Any) -> Any:
    """A function or dict ``map_location`` as the device it sends this file's storages to
    ("cpu", "cuda"), or None for where they were saved. Torch refuses a function under a fake
    mode ("Callable map_location not supported"), and ``storage.cuda()`` in one (the old
    ``lambda storage, loc: storage.cuda()``) would ask the driver."""
    if not callable(map_location) and not isinstance(map_location, dict):
        return map_location
    saved = first_location(f) or "cpu"
    if isinstance(map_location, dict):
        return map_location.get(saved, saved)
    probe = _WhereTo()
    try:
        sent = map_location(probe, saved)
    except Exception:  # noqa: BLE001 - a function that does more with the storage: to the host, as torch reads it
        return "cpu"
    if sent is None:
        return None
    return probe.where if sent is probe else "cpu"
