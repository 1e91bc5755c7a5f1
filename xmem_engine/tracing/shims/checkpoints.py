"""``torch.save`` and ``torch.load`` of fake tensors: checkpoints kept in memory, not written.

Why: training loops save the best model as they go (``torch.save(model.state_dict(), path)``)
and sometimes load it back at the end. Fake tensors have no values to write (pickling one
fails), and a checkpoint of a 7B model would be 28 GB of zeros on the user's disk. On a GPU
``torch.save`` copies each tensor to the host and allocates nothing on the device; so in fake
mode a save whose object holds fake tensors writes no tensors and keeps the object, and a later
``torch.load`` of the same path (or file object) in the traced code returns a copy, whose
tensors are new storages where ``map_location`` puts them, as a real load's are. Objects
without fake tensors are saved and loaded by torch as usual; a real file read to the host
comes back with its values where they are small (``host_loads.py``).

So that code which looks for a saved file finds it (``os.path.isfile``, a resume), a path
that held no file gets a placeholder (a valid file of its format holding one note), removed
after the trace; a file that was there is left as it was.

In both modes, a load puts tensors on the virtual GPU where a GPU run would: a
``map_location`` of ``cuda``, or none for a checkpoint saved from the GPU (in this trace, or
with ``cuda`` storages in the file). torch itself would refuse: this machine has no CUDA.
A kept object holds descriptions of its fake tensors (:class:`SavedTensor`), not the tensors:
a real save does not keep GPU memory alive, so a kept one must not either.

safetensors (``save_pretrained``, ``Trainer.save_model``, peft's adapters, ``save_file``)
likewise: what a file of fake tensors would hold (names, shapes, dtypes, metadata) is kept, not
written, and a later ``safe_open`` / ``load_file`` / ``from_pretrained`` of it reads back new
tensors of those shapes. On a GPU, safetensors copies each tensor to the host and writes from
there: no device memory. Small files (``config.json``, tokenizers) are written as usual.

Why the storages of fake tensors get addresses (``FakeAddresses``): libraries find tied and
shared weights by storage pointer (transformers' ``id_tensor_storage``, safetensors'
``_find_shared_tensors``), and every fake storage's pointer is 0, so a whole model looks like
one shared storage ("The weights trying to be saved contained shared tensors"). Fake and meta
storages get disjoint made-up addresses above any real pointer instead, as distinct storages
have on a GPU (``UntypedStorage.data_ptr`` only: nothing dereferences a storage's pointer, while
code that reads a tensor's - ctypes, Triton, bitsandbytes - must not be handed a made-up one).

Each kind of save is noted once per API and user line, with the tensors and bytes not written.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import math
import os
import pickle
import sys
import threading
import types
import weakref
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor

from xmem_engine.tracing.errors import NeedsRealValues
from xmem_engine.tracing.fake.fake_fastpaths import fake_empty
from xmem_engine.tracing.frames import TORCH_DIR, XMEM_DIR, is_user_file, user_frame
from xmem_engine.tracing.shims.host_loads import file_position, first_location, resolved_location, with_host_values
from xmem_engine.tracing.patches import patched_attr


#: host bytes of kept entries read back as real zeros; past this they are fake host tensors
KEPT_REAL_BYTES = 64 * 1024 * 1024


class _Finder(pickle.Pickler):
    """Walks what ``pickle`` would walk (modules, optimizers, nested containers), collecting
    the objects of one kind (tensors; kept tensors' descriptions) instead of writing them."""

    def __init__(self, kind: type) -> None:
        super().__init__(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL)
        self.kind = kind
        self.found: list[Any] = []

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, self.kind):
            self.found.append(obj)
            return len(self.found)
        return None


def _found(obj: Any, kind: type) -> list[Any] | None:
    """The objects of ``kind`` in ``obj``; None if pickle cannot walk it (nor could torch.save)."""
    finder = _Finder(kind)
    try:
        finder.dump(obj)
    except Exception:  # something torch.save could not write either: let it say so
        return None
    return finder.found


def _tensors(obj: Any) -> list[torch.Tensor] | None:
    return _found(obj, torch.Tensor)


def _key(f: Any) -> Any:
    if isinstance(f, (str, os.PathLike)):
        return os.path.abspath(os.fspath(f))
    return id(f)


def _to_host(location: Any) -> bool | None:
    """True for a ``map_location`` that means the host, False for CUDA, None otherwise."""
    if isinstance(location, str):
        location = torch.device(location)
    if isinstance(location, torch.device):
        return location.type == "cpu"
    return None


def _gib(nbytes: int) -> str:
    if nbytes >= 2**30:
        return f"{nbytes / 2**30:.2f} GiB"
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KiB"


def _saver(depth: int) -> tuple[str, str]:
    """Which API of a library the user's code called to save (the outermost library function
    below the user's frame: ``PreTrainedModel.save_pretrained``, ``Trainer.train``; "" when the
    user called ``torch.save`` itself; safetensors' function when the user called it), and the
    user's line."""
    f: types.FrameType | None = sys._getframe(depth)
    api = own = ""
    while f is not None:
        fn = f.f_code.co_filename
        if is_user_file(fn):
            break
        if f"{os.sep}safetensors{os.sep}" in fn:  # safetensors' own API, called by the user
            own = f"{f.f_globals.get('__name__', 'safetensors')}.{f.f_code.co_name}"
        elif "site-packages" in fn and not fn.startswith((TORCH_DIR, XMEM_DIR)):
            api = getattr(f.f_code, "co_qualname", f.f_code.co_name)
        f = f.f_back
    return api or own, f"{f.f_code.co_filename}:{f.f_lineno}" if f is not None else ""


class FakeAddresses:
    """Made-up addresses for storages that have none (fake and meta ones report 0): disjoint
    ranges, in allocation order, above any real pointer (user space ends below 2**47)."""

    BASE = 1 << 52
    ALIGN = 512

    def __init__(self) -> None:
        self.next = self.BASE
        self.ranges: dict[int, tuple[int, int]] = {}  # storage _cdata -> (address, bytes)

    def of(self, st: torch.UntypedStorage) -> int:
        n = st.nbytes()
        if n == 0:
            return 0
        key = st._cdata
        got = self.ranges.get(key)
        # A dead storage's key may come back for a new one (as a freed block's address does):
        # the same range serves it unless it is larger.
        if got is None or got[1] < n:
            got = (self.next, n)
            self.ranges[key] = got
            self.next += -(-n // self.ALIGN) * self.ALIGN + self.ALIGN
        return got[0]

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """``UntypedStorage.data_ptr`` answers with these addresses for the duration (fake mode
        only: real storages keep their pointers). ``Tensor.data_ptr`` stays 0 for a fake
        tensor: torch itself reads that as "no data" (``Tensor.__deepcopy__`` then clones)."""
        storage_ptr = torch.UntypedStorage.data_ptr

        def data_ptr(st: torch.UntypedStorage) -> int:
            if st.device.type == "meta":
                return self.of(st)
            return storage_ptr(st)

        with patched_attr(torch.UntypedStorage, "data_ptr", data_ptr):
            yield


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n


@dataclass(eq=False)
class SavedTensor:
    """A fake tensor in an object that ``torch.save`` kept: what a load needs to make it again.
    The kept object holds these, not the tensors, so a save does not keep GPU storages alive."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    on_gpu: bool
    param: bool
    requires_grad: bool

    @property
    def nbytes(self) -> int:
        return _nbytes(self.shape, self.dtype)


def _saved_tensors(obj: Any) -> list[SavedTensor]:
    return _found(obj, SavedTensor) or []


@dataclass
class KeptSafetensors:
    """What a safetensors file of fake tensors would hold: names, shapes, dtypes, metadata.
    No tensor is referenced: keeping one would keep its GPU storage alive past its time."""

    specs: dict[str, tuple[tuple[int, ...], torch.dtype]]
    metadata: dict[str, str] | None

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(shape, dtype) for shape, dtype in self.specs.values())


class _Unwritten(dict):
    """safetensors' flattened tensors, for a dict holding fake tensors: not to be written."""


_PLACEHOLDER = ("xmem: the tensors of this file were fake (an estimate traced the code without "
                "running it) and were not written; this placeholder is removed after the trace")


class KeptReader:
    """``safe_open`` of a kept file: the tensors come back new, of the kept shapes and dtypes,
    on ``device`` (host tensors are made in the calling thread's trace; transformers reads
    slices from a thread pool, so a slice's tensor is made when the slice is)."""

    def __init__(self, kept: KeptSafetensors, device: Any, framework: str, new: Callable[..., torch.Tensor]):
        if framework not in ("pt", "torch"):
            raise NeedsRealValues("safetensors.safe_open", f"framework={framework!r} needs the file's values",
                                  user_frame(3))
        self.kept, self.device, self._new = kept, device, new

    def __enter__(self) -> "KeptReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def keys(self) -> list[str]:
        return sorted(self.kept.specs)

    def offset_keys(self) -> list[str]:
        return list(self.kept.specs)

    def metadata(self) -> dict[str, str] | None:
        return dict(self.kept.metadata) if self.kept.metadata is not None else None

    def _spec(self, name: str) -> tuple[tuple[int, ...], torch.dtype]:
        try:
            return self.kept.specs[name]
        except KeyError:
            from safetensors import SafetensorError

            raise SafetensorError(f"File does not contain tensor {name}") from None

    def get_tensor(self, name: str) -> torch.Tensor:
        shape, dtype = self._spec(name)
        return self._new(shape, dtype, self.device)

    def get_tensors(self) -> dict[str, torch.Tensor]:
        return {k: self.get_tensor(k) for k in self.offset_keys()}

    def get_slice(self, name: str) -> "KeptSlice":
        shape, dtype = self._spec(name)
        return KeptSlice(self._new(shape, dtype, "cpu"))


class KeptSlice:
    """``safe_open(...).get_slice(name)`` of a kept file."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def get_shape(self) -> list[int]:
        return list(self.tensor.shape)

    def get_dtype(self) -> str:
        from safetensors.torch import _TYPES

        return next((code for code, dt in _TYPES.items() if dt == self.tensor.dtype), str(self.tensor.dtype))

    def __getitem__(self, index: Any) -> torch.Tensor:
        if index is Ellipsis:
            return self.tensor
        return self.tensor[index].clone()


def _has_fake(tensors: Any) -> bool:
    return isinstance(tensors, dict) and any(isinstance(v, FakeTensor) for v in tensors.values())


class Checkpoints:
    """The checkpoints one fake-mode trace saved: by absolute path, or by file object."""

    def __init__(self, tracer: Any):
        self.tracer = tracer
        self.kept: dict[Any, tuple[Any, Any]] = {}  # key -> (object, the file object kept alive)
        self.gpu_saved: dict[Any, bool] = {}  # key -> its tensors were on the virtual GPU
        self.safetensors: dict[str, KeptSafetensors] = {}  # absolute path -> what was not written
        self.placeholders: dict[str, tuple[int, int]] = {}  # path -> (size, mtime_ns) as written
        self.by_token: dict[str, Any] = {}  # a placeholder's token -> what it stands for
        # (kind, API, line) -> (index of its note, files, tensors, bytes)
        self._noted: dict[tuple[str, str, str], tuple[int, int, int, int]] = {}
        self._thread = threading.get_ident()
        self._real_bytes = 0  # host zeros made real for kept entries (_host_zeros)

    def _note(self, kind: str, fallback: str, n: int, nbytes: int, depth: int, extra: str = "") -> None:
        """One note per kind of save, API and user line, counting what it did not write."""
        api, where = _saver(depth + 1)
        key = (kind, api or fallback, where)
        at, files, tensors, total = self._noted.get(key, (-1, 0, 0, 0))
        files, tensors, total = files + 1, tensors + n, total + nbytes
        it = "it" if files == 1 else "them"
        text = (f"{api or fallback}{' at ' + where if where else ''} wrote nothing: {files} {kind} "
                f"file{'s' if files > 1 else ''} of {tensors} fake tensor{'s' if tensors != 1 else ''} "
                f"({_gib(total)}) kept in memory (a load of {it} in the traced code reads {it} back){extra}")
        notes = self.tracer.notes
        if 0 <= at < len(notes):
            notes[at] = text
        else:
            at = len(notes)
            notes.append(text)
        self._noted[key] = (at, files, tensors, total)

    # -- torch.save / torch.load
    def _saved(self, f: Any, on_gpu: bool) -> None:
        """Where ``f``'s tensors were; a file object's note dies with it (its id is the next one's)."""
        self.gpu_saved[_key(f)] = on_gpu
        if not isinstance(f, (str, os.PathLike)):
            weakref.finalize(f, self.gpu_saved.pop, id(f), None)

    def save(self, orig: Any) -> Any:
        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
            tensors = _tensors(obj)
            if not tensors or not any(isinstance(t, FakeTensor) for t in tensors):
                self._saved(f, any(self.tracer.is_gpu(t) for t in tensors or ()))
                return orig(obj, f, *args, **kwargs)
            if isinstance(f, (str, os.PathLike)):  # what torch says of a path it cannot write
                parent = os.path.dirname(os.path.abspath(os.fspath(f)))
                if not os.path.isdir(parent):
                    raise RuntimeError(f"Parent directory {parent} does not exist.")
            saved = {id(t): SavedTensor(tuple(t.shape), t.dtype, self.tracer.is_gpu(t),
                                        isinstance(t, torch.nn.Parameter), t.requires_grad)
                     for t in tensors if isinstance(t, FakeTensor)}
            memo: dict[int, Any] = dict(saved)
            with torch.no_grad():
                for t in tensors:  # real (host) tensors: their values, as the file would hold them
                    if id(t) not in memo:
                        c = t.detach().clone()
                        memo[id(t)] = torch.nn.Parameter(c, t.requires_grad) if isinstance(t, torch.nn.Parameter) else c
            try:
                kept = copy.deepcopy(obj, memo)  # the object, its fake tensors replaced by their descriptions
            except Exception:  # an object only pickle knows how to copy: kept as it is
                kept = obj
            self.kept[_key(f)] = (kept, None if isinstance(f, (str, os.PathLike)) else f)
            token = self._token(kept)
            extra = ""
            if isinstance(f, (str, os.PathLike)):
                extra = self._placeholder(f, lambda: orig({"xmem": _PLACEHOLDER, "xmem_kept": token}, f))
            else:  # a buffer whose bytes the caller writes somewhere (Lightning's checkpoints)
                orig({"xmem": _PLACEHOLDER, "xmem_kept": token}, f)
                extra = f"; the {type(f).__name__} got a placeholder (a file written from it holds no tensors)"
            self._note("torch.save", "torch.save", len(saved), sum(s.nbytes for s in saved.values()), 2, extra)

        return save

    def _token(self, kept: Any) -> str:
        """A name for a kept object that its placeholder carries, so that a load of the
        placeholder's bytes from anywhere (copied, renamed, written by the caller) finds it."""
        token = f"{uuid.uuid4().hex}"
        self.by_token[token] = kept
        return token

    def _kept_by_token(self, obj: Any) -> Any:
        token = obj.get("xmem_kept") if isinstance(obj, dict) and set(obj) == {"xmem", "xmem_kept"} else None
        return self.by_token.get(token) if isinstance(token, str) else None

    def load(self, orig: Any) -> Any:
        def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
            kept = self.kept.get(_key(f))
            if kept is not None:
                return self._copy(kept[0], map_location)
            obj = read(f, map_location, *args, **kwargs)
            kept = self._kept_by_token(obj)
            return obj if kept is None else self._copy(kept, map_location)

        def read(f: Any, map_location: Any, *args: Any, **kwargs: Any) -> Any:
            key, pos = _key(f), file_position(f)
            map_location = resolved_location(map_location, f)  # a function or dict: where it sends storages
            to_gpu = _to_host(map_location) is False

            def reread(mmap: bool) -> Any:  # the same file again, for real (host_loads.py)
                if pos is not None:
                    f.seek(pos)
                return orig(f, "cpu" if map_location is None else map_location, *args, **kwargs, **({"mmap": True} if mmap else {}))

            host = functools.partial(with_host_values, reread=None if pos == -1 else reread, tensors=_tensors,
                                     mode=self.tracer.fake_mode, room=lambda: KEPT_REAL_BYTES - self._real_bytes,
                                     spend=self._spend, mmap=pos is None and "mmap" not in kwargs)
            if not to_gpu and map_location is not None:
                return host(orig(f, map_location, *args, **kwargs))
            saved_on = first_location(f) if map_location is None else None
            obj = orig(f, "cpu", *args, **kwargs)  # in fake mode: meta tensors, no data read
            if to_gpu or self.gpu_saved.get(key) or (saved_on or "").startswith("cuda"):
                return self._copy(obj, "cuda")
            return host(obj)

        return load

    def _spend(self, nbytes: int) -> None:
        self._real_bytes += nbytes

    def _copy(self, obj: Any, map_location: Any) -> Any:
        """A copy of ``obj`` whose tensors are new storages: on the host for a CPU
        ``map_location``, on the virtual GPU for a CUDA one, where they were otherwise. A
        kept object's :class:`SavedTensor` descriptions become tensors as a real load makes
        them: read to the host, then copied to the GPU."""
        host = _to_host(map_location)
        memo: dict[int, Any] = {}
        with torch.no_grad():
            for s in _saved_tensors(obj):
                if id(s) in memo:
                    continue
                new = self._host_zeros(s.shape, s.dtype)
                if not (host if host is not None else not s.on_gpu):
                    new = new.to("cuda", copy=True)
                memo[id(s)] = torch.nn.Parameter(new, s.requires_grad) if s.param else new
            for t in _tensors(obj) or ():
                if id(t) in memo:
                    continue
                to_host = host if host is not None else not self.tracer.is_gpu(t)
                new = t.detach().to("cpu" if to_host else "cuda", copy=True)
                if isinstance(t, torch.nn.Parameter):
                    new = torch.nn.Parameter(new, t.requires_grad)
                memo[id(t)] = new
        return copy.deepcopy(obj, memo)

    # -- safetensors
    def _new_tensor(self, shape: tuple[int, ...], dtype: torch.dtype, device: Any) -> torch.Tensor:
        """A new tensor for a kept file's entry, where a real load puts it: the host, or the
        virtual GPU for ``device="cuda"`` / an index. Host ones: :meth:`_host_zeros`."""
        if isinstance(device, int) and not isinstance(device, bool):
            device = torch.device("cuda", device)
        on_gpu = torch.device(device).type == "cuda"
        if threading.get_ident() != self._thread and self.tracer.fake_mode is not None:
            # A loader's worker thread runs outside the trace's modes: a host fake tensor
            # (no memory), which it moves where it wants back in the traced thread.
            with self.tracer.fake_mode:
                return torch.empty(shape, dtype=dtype)
        return torch.zeros(shape, dtype=dtype, device="cuda") if on_gpu else self._host_zeros(shape, dtype)

    def _host_zeros(self, shape: Any, dtype: torch.dtype) -> torch.Tensor:
        """A kept entry read to the host: real zeros up to ``KEPT_REAL_BYTES`` in all (what host code
        reads: a step count, an RNG state), then fake. A 1B model read back slice by slice, each
        under the tracer's 16 MiB for real host tensors, had made 1.4 GB of host zeros."""
        nbytes = math.prod(shape) * dtype.itemsize
        mode = self.tracer.fake_mode
        if mode is None or self._real_bytes + nbytes <= KEPT_REAL_BYTES:
            self._real_bytes += nbytes
            return torch.zeros(shape, dtype=dtype)
        return fake_empty(mode, shape, None, dtype, torch.device("cpu"))

    def flatten(self, orig: Any) -> Any:
        """safetensors' ``_flatten_as_ptr`` / ``_flatten``: a dict of fake tensors is checked as
        safetensors checks it (shared, sparse, non-contiguous tensors are the same errors) and
        becomes an :class:`_Unwritten`, without touching the tensors' (absent) values."""
        import safetensors.torch as st

        def flatten(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if not _has_fake(tensors):
                return orig(tensors, *args, **kwargs)
            check = getattr(st, "_evaluate_tensors_for_save", None)
            if check is not None:
                check(tensors)
            for k, v in tensors.items():
                if not v.is_contiguous():
                    raise ValueError(
                        f"You are trying to save a non contiguous tensor: `{k}` which is not allowed. It either means"
                        " you are trying to save tensors which are reference of each other in which case it's"
                        " recommended to save only the full tensors, and reslice at load time, or simply call"
                        " `.contiguous()` on your tensor to pack it before saving.")
            return _Unwritten({k: (tuple(v.shape), v.dtype) for k, v in tensors.items()})

        return flatten

    def serialize_file(self, orig: Any) -> Any:
        def serialize_file(flat: Any, filename: Any, metadata: Any = None, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(flat, _Unwritten):
                return orig(flat, filename, metadata, *args, **kwargs)
            path = os.path.abspath(os.fspath(filename))
            kept = self.safetensors[path] = KeptSafetensors(dict(flat), dict(metadata) if metadata else None)
            token = self._token(kept)
            extra = self._placeholder(path, lambda: orig({}, filename, {"xmem": _PLACEHOLDER, "xmem_kept": token},
                                                         *args, **kwargs))
            self._note("safetensors", "safetensors.torch.save_file", len(flat), kept.nbytes, 2, extra)

        return serialize_file

    def serialize(self, orig: Any) -> Any:
        def serialize(flat: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(flat, _Unwritten):
                raise NeedsRealValues("safetensors.torch.save", "the bytes of a safetensors file of fake tensors "
                                      "need the tensors' values", user_frame(2))
            return orig(flat, *args, **kwargs)

        return serialize

    def safe_open(self, orig: Any) -> Any:
        def safe_open(filename: Any, framework: str = "pt", device: Any = "cpu", *args: Any, **kwargs: Any) -> Any:
            kept = None
            if isinstance(device, int) and not isinstance(device, bool):  # an index: safetensors
                device = f"cuda:{device}"  # then builds through torch.asarray(storage), which the modes refuse
            if isinstance(filename, (str, os.PathLike)):
                kept = self.safetensors.get(os.path.abspath(os.fspath(filename)))
            if kept is None:
                opened = orig(filename, framework, device, *args, **kwargs)
                kept = self._kept_by_token(opened.metadata() or {})  # a placeholder copied elsewhere
                if kept is None:
                    return opened
            return KeptReader(kept, device, framework, self._new_tensor)

        safe_open.__wrapped__ = orig  # type: ignore[attr-defined]
        return safe_open

    def _placeholder(self, f: Any, write: Callable[[], Any]) -> str:
        """Write a placeholder where a file of fake tensors would be (so that code looking for
        it finds it), unless a file of the user's is there: that one is left alone (a load in
        the trace still reads what was kept). Says so, for the note."""
        path = os.path.abspath(os.fspath(f))
        if path not in self.placeholders and os.path.exists(path):
            return f"; {os.path.basename(path)} was there before and was left as it was"
        write()
        stat = os.stat(path)
        self.placeholders[path] = (stat.st_size, stat.st_mtime_ns)
        return ""

    def remove_placeholders(self) -> None:
        """The placeholders written, unless something else has written the file since."""
        for path, (size, mtime) in self.placeholders.items():
            with contextlib.suppress(OSError):
                stat = os.stat(path)
                if (stat.st_size, stat.st_mtime_ns) == (size, mtime):
                    os.remove(path)


@contextlib.contextmanager
def _rebound(orig: Any, new: Any) -> Iterator[None]:
    """Every module-level name bound to ``orig`` (``from safetensors import safe_open`` in
    transformers) bound to ``new`` for the duration; afterwards every name bound to ``new``,
    also by modules imported meanwhile, is bound to ``orig`` again."""

    def swap(old: Any, to: Any) -> None:
        for name, m in list(sys.modules.items()):
            if name.startswith("torch.") or name == "torch":  # a third of the modules; none imports safetensors
                continue
            d = getattr(m, "__dict__", None)
            if not isinstance(d, dict):
                continue
            hits = [k for k, v in d.items() if v is old]
            for k in hits:
                d[k] = to

    swap(orig, new)
    try:
        yield
    finally:
        swap(new, orig)


def _is_complete(orig: Callable[[torch.Tensor], bool]) -> Callable[[torch.Tensor], bool]:
    """safetensors' "this tensor covers its whole storage", for fake tensors too."""
    def is_complete(t: torch.Tensor) -> bool:
        if not isinstance(t, FakeTensor):
            return orig(t)
        return t.storage_offset() == 0 and t.numel() * t.element_size() == t.untyped_storage().nbytes()

    return is_complete


@contextlib.contextmanager
def _safetensors_kept(cp: Checkpoints) -> Iterator[None]:
    """safetensors as described above, when it is installed (fake mode)."""
    try:
        import safetensors
        import safetensors.torch as st
    except ImportError:
        safetensors = None
    if safetensors is None:  # (yielded outside the except: the user's errors carry no ImportError)
        yield
        return
    with contextlib.ExitStack() as stack:
        for name in ("_flatten_as_ptr", "_flatten"):
            if hasattr(st, name):
                stack.enter_context(patched_attr(st, name, cp.flatten(getattr(st, name))))
        stack.enter_context(patched_attr(st, "serialize_file", cp.serialize_file(st.serialize_file)))
        stack.enter_context(patched_attr(st, "serialize", cp.serialize(st.serialize)))
        if hasattr(st, "_is_complete"):  # save_model's choice among tied names (Tensor.data_ptr is 0)
            stack.enter_context(patched_attr(st, "_is_complete", _is_complete(st._is_complete)))
        orig_open = safetensors.safe_open
        stack.enter_context(_rebound(orig_open, cp.safe_open(orig_open)))
        yield


@contextlib.contextmanager
def kept_in_memory(tracer: Any) -> Iterator[Checkpoints]:
    """``torch.save`` / ``torch.load`` as described above, for the duration; in fake mode
    also safetensors, and the made-up addresses of fake storages."""
    cp = Checkpoints(tracer)
    import torch.serialization as ser

    with contextlib.ExitStack() as stack:
        save, load = cp.save(ser.save), cp.load(ser.load)
        for mod in (torch, ser):
            stack.enter_context(patched_attr(mod, "save", save))
            stack.enter_context(patched_attr(mod, "load", load))
        stack.callback(cp.remove_placeholders)
        if tracer.fake:
            stack.enter_context(FakeAddresses().installed())
            stack.enter_context(_safetensors_kept(cp))
        yield cp
