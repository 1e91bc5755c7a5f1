"""Distributed training, one rank at a time: a script written for ``torchrun`` traced as the
rank it names, with torch.distributed's own fake process group in place of NCCL.

A script launched by ``torchrun --nproc-per-node 8`` reads ``RANK`` / ``LOCAL_RANK`` /
``WORLD_SIZE`` from its environment, calls ``dist.init_process_group("nccl")`` and
``torch.cuda.set_device(local_rank)``, and wraps its model in DDP or FSDP. Here one process
plays one rank (:class:`World`): the environment is torchrun's for that rank, the virtual
``torch.cuda`` has ``gpus_per_node`` devices with the traced one current, and every
``init_process_group`` (whatever backend and rendezvous it names) makes torch's
``FakeProcessGroup`` (``torch.testing._internal.distributed.fake_pg``, backend ``"fake"``):
a group of ``world.size`` ranks whose collectives return at once and leave their outputs as
they are. The memory of a collective is its tensors, and those are the caller's: the output
of ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` is allocated by the code that calls
it (FSDP's unsharded parameters, DDP's buckets) exactly as on the GPU, and NCCL's in-place
collectives (``all_reduce``, ``broadcast``) allocate nothing in PyTorch's allocator. NCCL's
own communication buffers are cudaMalloc'ed outside the caching allocator (the estimate's
notes say so).

DDP's reducer and ``broadcast_coalesced`` are C++: their factories name the parameters' real
(CPU) device and are called with the device mode still on the stack. :func:`on_gpu` runs
them with the device mode off and every storage they make on the virtual GPU, so DDP's
gradient buckets and its flattened broadcast buffers are where a GPU run has them.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from xmem_engine.trace import Category
from xmem_engine.tracing.patches import on_import, patched_attr
from xmem_engine.tracing.shims.process_spawn import processes_in_process
from xmem_engine.tracing.scope import Device

# torchrun's environment for one rank (torch/distributed/elastic/agent/server/api.py)
ENV_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
            "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
GPUS_PER_NODE = 8  # an HGX / DGX node; --gpus-per-node changes it
NCCL_NOTE = ("not included: NCCL's own communication buffers, which NCCL allocates outside PyTorch's caching "
             "allocator (NCCL_BUFFSIZE, 4 MiB by default, for each channel and peer of a communicator)")


@dataclass(frozen=True)
class World:
    """The ranks a trace stands in for: ``size`` processes, ``gpus_per_node`` to a node, and
    the one traced (``rank``). One rank of one GPU is the default: a plain script."""

    size: int = 1
    rank: int = 0
    gpus_per_node: int = GPUS_PER_NODE

    def __post_init__(self) -> None:
        for name in ("size", "gpus_per_node"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"world {name.replace('_', ' ')} must be a whole number of at least 1, not {v!r}")
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or not 0 <= self.rank < self.size:
            raise ValueError(f"rank must be between 0 and {self.size - 1} (the world size is {self.size}), "
                             f"not {self.rank!r}")

    @property
    def local_size(self) -> int:
        """Processes on the traced rank's node (torchrun's ``--nproc-per-node``)."""
        return min(self.size, self.gpus_per_node)

    @property
    def local_rank(self) -> int:
        return self.rank % self.local_size

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def env(self) -> dict[str, str]:
        """What torchrun puts in the environment of this rank."""
        return {
            "RANK": str(self.rank), "LOCAL_RANK": str(self.local_rank), "WORLD_SIZE": str(self.size),
            "LOCAL_WORLD_SIZE": str(self.local_size), "GROUP_RANK": str(self.rank // self.local_size),
            "ROLE_RANK": str(self.rank), "ROLE_WORLD_SIZE": str(self.size),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "xmem",
        }

    def as_json(self) -> dict[str, int]:
        return {"size": self.size, "rank": self.rank, "gpus_per_node": self.gpus_per_node}


def available() -> bool:
    """torch.distributed and its fake process group are part of this torch build."""
    try:
        import torch.distributed as dist

        return dist.is_available() and hasattr(torch._C, "_distributed_c10d") and \
            hasattr(torch._C._distributed_c10d, "FakeProcessGroup")
    except ImportError:  # pragma: no cover - a build without distributed
        return False


@contextlib.contextmanager
def environment(world: World) -> Iterator[None]:
    """torchrun's variables for ``world``'s rank, and the process's own back afterwards."""
    saved = {k: os.environ.get(k) for k in ENV_KEYS}
    os.environ.update(world.env())
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _pop_function_mode(mode: Any) -> contextlib.AbstractContextManager:
    """Take ``mode`` off the torch-function stack for a call, when it is on top."""
    from torch.overrides import _get_current_function_mode_stack, _pop_mode_temporarily

    stack = _get_current_function_mode_stack()
    if stack and stack[-1] is mode:
        return _pop_mode_temporarily()
    return contextlib.nullcontext()


# What DDP's C++ makes on the host even on a GPU run: the bucket indices it agrees with rank 0
# (reducer.cpp, sync_bucket_indices) and reads back.
_INDEX_DTYPES = (torch.int32, torch.int64)


def on_gpu(fn: Callable[..., Any], tracer: Any, device_mode: Any) -> Callable[..., Any]:
    """``fn`` (C++ code of torch.distributed that makes tensors) with the device mode off and
    every storage it makes on the virtual GPU, as it is on a GPU run: communication buffers
    (integer index tensors made from nothing stay on the host, as they do there)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        with _pop_function_mode(device_mode), tracer.call_scope(
                target=Device.GPU, category=Category.COMMUNICATION, host_dtypes=_INDEX_DTYPES):
            return fn(*args, **kwargs)

    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call


def _same_on_every_rank(process_group: Any, tensors: Any, logger: Any = None) -> None:
    """``dist._verify_params_across_processes``: every traced rank runs the same script."""


def _reducer_class(tracer: Any, device_mode: Any) -> type:
    """DDP's ``dist.Reducer`` with its tensor-making methods on the virtual GPU: the buckets
    at construction and when DDP rebuilds them after the first backward."""
    import torch.distributed as dist

    base = dist.Reducer
    ns: dict[str, Any] = {"__doc__": base.__doc__, "__module__": __name__}

    for name in ("__init__", "_rebuild_buckets", "prepare_for_forward", "prepare_for_backward",
                 "_get_zeros_like_grad_buckets"):
        if hasattr(base, name):  # a plain function in the class body: called with self first
            ns[name] = on_gpu(getattr(base, name), tracer, device_mode)
    return type("Reducer", (base,), ns)


BACKEND = "xmem"  # the process group's backend name, registered for the trace's duration


def _done(result: Any) -> Any:
    """A finished ``Work`` whose future holds ``result``, as NCCL's hold their outputs
    (DDP's reducer and communication hooks read them)."""
    from torch._C._distributed_c10d import _create_work_from_future
    from torch.futures import Future

    fut: Future = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


@functools.cache
def _process_group_class() -> type:
    """The process group class, made once (it subclasses torch's ``ProcessGroup``, which
    needs torch.distributed loaded: not at import)."""
    import torch.distributed as dist
    from torch.distributed import ReduceOp

    def _summed(t: torch.Tensor, op: Any, n: int) -> None:
        # Every rank runs the same code on the same values: a sum is n of them.
        if op == ReduceOp.SUM and n > 1 and not t.is_complex() and t.dtype != torch.bool:
            t.mul_(n)

    class XmemProcessGroup(dist.ProcessGroup):
        """``world_size`` ranks that all hold what this one holds: each collective fills its
        outputs in place as if every rank had sent this rank's inputs (a gather repeats
        them, a sum multiplies them), allocates nothing of its own, and returns a finished
        ``Work`` whose future holds the outputs. The memory is the caller's tensors, as
        with NCCL."""

        def __init__(self, rank: int, world_size: int):
            super().__init__(rank, world_size)
            self._rank, self._world_size = rank, world_size

        def size(self) -> int:
            return self._world_size

        def getBackendName(self) -> str:
            return BACKEND

        @property
        def group_name(self) -> str:
            """The name torch.distributed registered this group under (DeviceMesh asks)."""
            return dist.distributed_c10d._world.pg_names[self]

        pg_name = group_name

        def __repr__(self) -> str:
            return f"XmemProcessGroup(rank={self._rank}, world_size={self._world_size})"

        def allreduce(self, tensor_list: list, opts: Any = None) -> Any:
            for t in tensor_list:
                _summed(t, getattr(opts, "reduceOp", ReduceOp.SUM), self._world_size)
            return _done(tensor_list)

        allreduce_coalesced = allreduce

        def barrier(self, opts: Any = None) -> Any:
            return _done(None)

        def broadcast(self, tensor_list: list, opts: Any = None) -> Any:
            return _done(tensor_list)

        def allgather(self, output_tensors: list, input_tensor: list, opts: Any = None) -> Any:
            for outs, inp in zip(output_tensors, input_tensor):
                for o in outs:
                    o.copy_(inp)
            return _done(output_tensors)

        def all_gather_single(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, opts: Any = None) -> Any:
            for o in output_tensor.chunk(self._world_size):
                o.copy_(input_tensor.view_as(o) if input_tensor.numel() == o.numel() else input_tensor)
            return _done([output_tensor])

        def all_gather_single_coalesced(self, output_tensors: list, input_tensors: list, opts: Any = None) -> Any:
            for o, i in zip(output_tensors, input_tensors):
                self.all_gather_single(o, i, opts)
            return _done(output_tensors)

        def reduce_scatter(self, output_tensor: list, scatter_list: list, opts: Any = None) -> Any:
            for o, chunks in zip(output_tensor, scatter_list):
                o.copy_(chunks[self._rank])
                _summed(o, getattr(opts, "reduceOp", ReduceOp.SUM), self._world_size)
            return _done(output_tensor)

        def reduce_scatter_single(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, opts: Any = None) -> Any:
            mine = input_tensor.chunk(self._world_size)[self._rank]
            output_tensor.copy_(mine.view_as(output_tensor))
            _summed(output_tensor, getattr(opts, "reduceOp", ReduceOp.SUM), self._world_size)
            return _done([output_tensor])

        def reduce_scatter_single_coalesced(self, output_tensors: list, input_tensors: list, opts: Any = None) -> Any:
            for o, i in zip(output_tensors, input_tensors):
                self.reduce_scatter_single(o, i, opts)
            return _done(output_tensors)

        def reduce(self, tensor_list: list, opts: Any = None) -> Any:
            return self.allreduce(tensor_list, opts)

        def gather(self, output_tensors: list, input_tensors: list, opts: Any = None) -> Any:
            return self.allgather(output_tensors, input_tensors, opts)

        def scatter(self, output_tensors: list, input_tensors: list, opts: Any = None) -> Any:
            for o, ins in zip(output_tensors, input_tensors or [[]]):
                if ins:
                    o.copy_(ins[self._rank])
            return _done(output_tensors)

        def alltoall(self, output_tensor_list: list, input_tensor_list: list, opts: Any = None) -> Any:
            for o in output_tensor_list:
                o.copy_(input_tensor_list[self._rank])
            return _done(output_tensor_list)

        def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: Any,
                              input_split_sizes: Any, opts: Any = None) -> Any:
            return _done([output])

        # The same collectives under the names older releases' ProcessGroup trampoline calls
        # (torch 2.10-2.12: _allgather_base, ...; later: all_gather_single, ...).
        _allgather_base = all_gather_single
        _reduce_scatter_base = reduce_scatter_single
        alltoall_base = all_to_all_single
        allgather_into_tensor_coalesced = all_gather_single_coalesced
        reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

        def send(self, tensors: list, dst: int, tag: int = 0) -> Any:
            return _done(None)

        def recv(self, tensors: list, src: int, tag: int = 0) -> Any:
            return _done(tensors)

    return XmemProcessGroup


@contextlib.contextmanager
def _backend_registered() -> Iterator[None]:
    """The ``xmem`` backend in torch.distributed's registry, and out of it again after."""
    import torch.distributed as dist

    B = dist.Backend
    cls = _process_group_class()
    saved = (dict(B._plugins), dict(B.backend_capability), dict(B.backend_type_map),
             dict(B.default_device_backend_map), list(B.backend_list))
    if BACKEND.upper() not in B._plugins:
        B.register_backend(BACKEND, lambda store, rank, size, timeout: cls(rank, size), devices=["cpu", "cuda"])
    try:
        yield
    finally:
        B._plugins.clear(); B._plugins.update(saved[0])
        B.backend_capability.clear(); B.backend_capability.update(saved[1])
        B.backend_type_map.clear(); B.backend_type_map.update(saved[2])
        B.default_device_backend_map.clear(); B.default_device_backend_map.update(saved[3])
        B.backend_list[:] = saved[4]
        if hasattr(B, BACKEND.upper()) and BACKEND.upper() not in saved[0]:
            with contextlib.suppress(AttributeError):
                delattr(B, BACKEND.upper())


def _fake_init(orig: Callable[..., Any], world: World, made: list) -> Callable[..., Any]:
    """``init_process_group`` as the traced rank sees it: whatever backend, rendezvous and
    store the code names, a fake group of ``world.size`` ranks (explicit ``rank`` /
    ``world_size`` arguments must agree with the world being traced)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def init_process_group(backend: Any = None, init_method: Any = None, timeout: Any = None,
                           world_size: int = -1, rank: int = -1, store: Any = None,
                           group_name: str = "", pg_options: Any = None, device_id: Any = None,
                           **kwargs: Any) -> None:
        for what, given, ours in (("world_size", world_size, world.size), ("rank", rank, world.rank)):
            if given not in (-1, None) and int(given) != ours:
                raise ValueError(
                    f"init_process_group({what}={given}) in the code, but xmem is tracing rank {world.rank} of a "
                    f"world of {world.size} (--world-size / --rank): read them from the environment "
                    f"(WORLD_SIZE, RANK), as torchrun sets them, or estimate with --world-size {given if what == 'world_size' else world.size}")
        call: dict[str, Any] = {"backend": BACKEND, "store": FakeStore(), "world_size": world.size,
                                "rank": world.rank}
        if timeout is not None:
            call["timeout"] = timeout
        if group_name:
            call["group_name"] = group_name
        orig(**call)
        made.append(True)

    init_process_group.__wrapped__ = orig  # type: ignore[attr-defined]
    return init_process_group


def _replace_everywhere(stack: contextlib.ExitStack, obj: Any, name: str, new: Any) -> None:
    """``new`` in place of ``obj`` under ``name`` in every module of ``sys.modules`` that holds
    it (a function imported by name before the trace: ``from torch.distributed import
    init_process_group``), for the stack's duration."""
    for mod in list(sys.modules.values()):
        d = getattr(mod, "__dict__", None)
        if d is not None and d.get(name) is obj:
            stack.enter_context(patched_attr(mod, name, new))


FSDP2 = "torch.distributed.fsdp._fully_shard._fsdp_param_group"


def _in_scope(fn: Callable[..., Any], tracer: Any, category: Category) -> Callable[..., Any]:
    """``fn`` with the storages it makes classified as ``category`` (a gradient or parameter
    made inside keeps its own, higher, category: ``Tracer._upgrade``)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        with tracer.call_scope(category=category):
            return fn(*args, **kwargs)

    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call


def _fsdp2_patches(stack: contextlib.ExitStack, tracer: Any, load: bool) -> None:
    """FSDP2's buffers in their categories: the all-gather's flat output and the
    reduce-scatter's flat input are communication buffers; an unsharded parameter, whose
    storage FSDP grows back before each all-gather (``alloc_storage``), is a parameter (else it
    would count as an activation, being saved for backward)."""
    if FSDP2 not in sys.modules:
        if not load:
            return
        import importlib

        importlib.import_module(FSDP2)
    group = sys.modules[FSDP2]
    for name in ("foreach_all_gather", "foreach_reduce"):
        f = getattr(group, name, None)
        if f is not None:
            stack.enter_context(patched_attr(group, name, _in_scope(f, tracer, Category.COMMUNICATION)))
    alloc = getattr(group, "alloc_storage", None)
    if alloc is not None:
        _replace_everywhere(stack, alloc, "alloc_storage", _in_scope(alloc, tracer, Category.PARAMETER))


def _functional_collectives(stack: contextlib.ExitStack) -> None:
    """The functional collectives DTensor redistributes with (tensor parallelism), in this
    process: each makes its output once, as the GPU op does (a reduced copy, N inputs
    gathered, one rank's share of a scatter), every rank holding this rank's values. torch's
    own ops abort the process on an in-process group before 2.13, and from 2.13 on fake mode
    counts their ``wait_tensor`` as a second output, which a GPU run does not allocate."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    import torch.distributed.distributed_c10d as c10d

    def group_of(group: Any, tag: str) -> Any:
        return c10d._resolve_process_group(funcol._resolve_group_name(group, tag))

    def all_reduce(self: torch.Tensor, reduceOp: str, group: Any, tag: str = "") -> torch.Tensor:
        out = self.clone()
        if reduceOp.lower() == "sum":
            out.mul_(group_of(group, tag).size())
        return out

    def all_gather_tensor(self: torch.Tensor, gather_dim: int, group: Any, tag: str = "") -> torch.Tensor:
        return torch.cat([self] * group_of(group, tag).size(), dim=gather_dim)

    def reduce_scatter_tensor(self: torch.Tensor, reduceOp: str, scatter_dim: int, group: Any,
                              tag: str = "") -> torch.Tensor:
        pg = group_of(group, tag)
        out = self.chunk(pg.size(), dim=scatter_dim)[dist.get_rank(pg)].clone()
        if reduceOp.lower() == "sum":
            out.mul_(pg.size())
        return out

    for name, fn in (("all_reduce", all_reduce), ("all_gather_tensor", all_gather_tensor),
                     ("reduce_scatter_tensor", reduce_scatter_tensor)):
        orig = getattr(funcol, name, None)
        if orig is not None:
            fn.__wrapped__ = orig  # type: ignore[attr-defined]
            _replace_everywhere(stack, orig, name, fn)


def _fsdp1_patches(stack: contextlib.ExitStack, tracer: Any) -> None:
    """FSDP1 (``FullyShardedDataParallel``): the unsharded flat parameter, whose storage it
    grows back before each all-gather (``torch.distributed.utils._alloc_storage``), is a
    parameter; it frees it by resizing the storage, which the tracer sees
    (``storage_resize``)."""
    import torch.distributed.utils as dist_utils

    alloc = getattr(dist_utils, "_alloc_storage", None)
    if alloc is not None:
        _replace_everywhere(stack, alloc, "_alloc_storage", _in_scope(alloc, tracer, Category.PARAMETER))


def _dtensor_patches(stack: contextlib.ExitStack) -> None:
    """DTensor's random ops and sharding propagation on the virtual GPU. A random op on a
    DTensor (``reset_parameters()`` after meta-device init) builds an RNG tracker from
    ``torch.cuda.get_rng_state().to("cuda")`` inside DTensor's dispatch, below both of
    xmem's modes: without the tracker DTensor draws on the local shard (the same memory;
    other values than a GPU run's). Sharding propagation runs the op on tensors rebuilt on
    the mesh's device type, "cuda", which a CPU build cannot make: only their shape, stride
    and dtype are read, so they are rebuilt on the CPU."""
    dispatch = sys.modules.get("torch.distributed.tensor._dispatch")
    schema = sys.modules.get("torch.distributed.tensor._op_schema")
    if dispatch is not None and hasattr(dispatch, "is_rng_supported_mesh"):
        stack.enter_context(patched_attr(dispatch, "is_rng_supported_mesh", lambda mesh: False))
    rebuild = getattr(schema, "_rebuild_tensor_from_dtensor_meta", None) if schema is not None else None
    if rebuild is not None:
        def on_host(arg: Any) -> torch.Tensor:
            if arg.tensor_meta is None:
                return rebuild(arg)  # torch's own error
            meta = arg.tensor_meta
            return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device="cpu")

        _replace_everywhere(stack, rebuild, "_rebuild_tensor_from_dtensor_meta", on_host)


def _object_collectives(stack: contextlib.ExitStack) -> None:
    """torch.distributed's collectives of pickled objects, as the fake group's tensor collectives
    behave: every rank holds what this one holds. Their bytes travel in small tensors whose
    values the group does not carry, so a rank other than the source unpickled nothing
    ("Ran out of input": ``broadcast_object_list`` traced as rank 1; Lightning's and
    accelerate's broadcasts use it). Their memory is a few KB; none is recorded."""
    import copy

    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    def others(obj: Any) -> Any:  # another rank's copy arrives unpickled: a copy of its own
        try:
            return copy.deepcopy(obj)
        except Exception:
            return obj

    def group_rank(group: Any) -> int:
        return dist.get_rank() if group is None else dist.get_rank(group)

    # (torch's parameter names: DCP's planner passes them by keyword)
    def broadcast_object_list(object_list: list, src: Any = None, group: Any = None, device: Any = None,
                              group_src: Any = None, **kwargs: Any) -> None:
        return None  # the source's objects are this rank's

    def all_gather_object(object_list: list, obj: Any, group: Any = None, **kwargs: Any) -> None:
        mine = group_rank(group)
        for i in range(len(object_list)):
            object_list[i] = obj if i == mine else others(obj)

    def gather_object(obj: Any, object_gather_list: list | None = None, dst: Any = None, group: Any = None,
                      group_dst: Any = None, **kwargs: Any) -> None:
        if object_gather_list is not None:  # the destination rank
            all_gather_object(object_gather_list, obj, group)

    def scatter_object_list(scatter_object_output_list: list, scatter_object_input_list: Any = None,
                            src: Any = None, group: Any = None, group_src: Any = None, **kwargs: Any) -> None:
        # the source rank takes its own share; elsewhere the source's list is not known: what
        # the output list holds stays (DCP traced as a rank other than its coordinator)
        if scatter_object_input_list is not None:
            scatter_object_output_list[0] = scatter_object_input_list[group_rank(group)]

    for name, new in (("broadcast_object_list", broadcast_object_list), ("all_gather_object", all_gather_object),
                      ("gather_object", gather_object), ("scatter_object_list", scatter_object_list)):
        f = getattr(c10d, name, None)
        if f is not None:
            _replace_everywhere(stack, f, name, new)


def _dcp_each_rank_alone(stack: contextlib.ExitStack) -> None:
    """``torch.distributed.checkpoint`` across ranks: each rank plans, writes and reads its own
    shards as a checkpoint of its own. DCP's coordinator makes one plan of every rank's; the
    other ranks are not traced, and this rank's plan taken for all of them covered one shard
    twice ("Failed to validate global plan"). What a rank moves between its GPU and the files
    is its own shards either way."""

    def one_rank(utils: Any) -> None:
        init = utils._DistWrapper.__init__

        def __init__(self: Any, group: Any, use_dist: bool, coordinator_rank: int) -> None:
            init(self, group, False, coordinator_rank)

        stack.enter_context(patched_attr(utils._DistWrapper, "__init__", __init__))

    def its_shards(planner: Any) -> None:
        validate = planner._validate_global_plan

        def _validate_global_plan(global_plan: Any, metadata: Any) -> Any:
            # this rank's chunks cover its shards, not the tensors: accepted, as torch's answer
            return [] if isinstance(validate(global_plan, metadata), list) else True

        stack.enter_context(patched_attr(planner, "_validate_global_plan", _validate_global_plan))

    stack.enter_context(on_import(["torch.distributed.checkpoint.utils"], one_rank))
    stack.enter_context(on_import(["torch.distributed.checkpoint.default_planner"], its_shards))


@contextlib.contextmanager
def simulated_world(tracer: Any, world: World | None, device_mode: Any) -> Iterator[None]:
    """The traced rank's distributed world, for the trace's duration: torchrun's environment
    (only for a world that was named: scripts test ``"RANK" in os.environ`` to choose DDP),
    ``init_process_group`` making fake groups (of one rank without a world), DDP's C++ on
    the virtual GPU. Groups the code leaves behind are destroyed on the way out."""
    with contextlib.ExitStack() as stack:
        if world is not None:
            stack.enter_context(environment(world))
        world = world or World()
        processes_in_process(stack, world, tracer.notes, _replace_everywhere)  # mp.spawn: this rank, here
        if not available():
            yield
            return
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        was_initialized = dist.is_initialized()
        stack.enter_context(_backend_registered())
        made: list = []
        orig = c10d.init_process_group
        _replace_everywhere(stack, orig, "init_process_group", _fake_init(orig, world, made))
        # DDP's construction: each rank's parameter shapes are checked against the others'
        # (C++ reading the sizes into a few KB, which fake tensors cannot give: every rank
        # here is the same script, so there is nothing to check), then rank 0's states are
        # broadcast in flattened buckets (their memory counts: on the GPU).
        replacements = {"_broadcast_coalesced": lambda f: on_gpu(f, tracer, device_mode),
                        "_verify_params_across_processes": lambda f: _same_on_every_rank}
        for name, make in replacements.items():
            f = getattr(dist, name, None)
            if f is not None:
                _replace_everywhere(stack, f, name, make(f))
        if hasattr(dist, "Reducer"):
            stack.enter_context(patched_attr(dist, "Reducer", _reducer_class(tracer, device_mode)))
        _fsdp2_patches(stack, tracer, load=world.distributed)
        _dtensor_patches(stack)
        _fsdp1_patches(stack, tracer)
        _functional_collectives(stack)
        _object_collectives(stack)
        if world.distributed:
            _dcp_each_rank_alone(stack)
        try:
            yield
        finally:
            if made:
                tracer.notes.append(NCCL_NOTE)
            if made and not was_initialized and dist.is_initialized():
                dist.destroy_process_group()
