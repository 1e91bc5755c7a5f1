"""The tracing wing: run code written for ``cuda`` on the CPU and record its GPU memory requests.

How it works
------------
* A :class:`torch.overrides.TorchFunctionMode` (``device_mode.DeviceMode``) is the *virtual CUDA
  device*: it rewrites ``device="cuda"``, ``.cuda()``, ``.to("cuda")`` ... to the CPU, makes
  tensors that live "on the GPU" report ``cuda:0`` (``.device``, ``.is_cuda``), and marks the
  phases (``backward()``). ``virtual_cuda.patched_cuda`` answers ``torch.cuda.*``.
* A :class:`torch.utils._python_dispatch.TorchDispatchMode` (``alloc_mode.AllocMode``) sees every aten
  op. A storage it has not seen before is an allocation; it is "on the GPU" when the op was
  a transfer to / factory on ``cuda`` or read a GPU storage. A weakref on the storage
  reports the free at the moment the storage dies - the moment the caching allocator would
  get the block back. Views share their storage (no allocation); in-place ops allocate nothing.
* ``mode="fake"`` runs the GPU side under :class:`FakeTensorMode` (no arithmetic, no memory):
  every tensor on the virtual GPU and every ``nn.Parameter`` is fake, and so is a host
  tensor made by a factory larger than ``HOST_REAL_BYTES``; other CPU-side work (data
  loading, samplers, metrics on CPU tensors) runs for real, so it sees real values.
  Random weight initialisers (``torch.nn.init``) leave fake tensors alone. Small GPU
  tensors whose values are known (masks, ids, labels moved from the host, constant
  initialisers, and what deterministic ops make of them) keep a real copy, so branches on
  them and ``nonzero`` take the path a GPU takes (``shadow_values.py``). Values nobody
  knows (a loss, a gradient norm) are guessed, and sizes that depend on them take their
  upper bound; each guess is noted with its line (``guesses.py``). ``.item()`` of a fake
  tensor is a number that may be printed or summed freely; its use in control flow is a
  guess. ``torch.save`` and safetensors (``save_pretrained``) of fake tensors write nothing
  (``checkpoints.py``).
  ``mode="real"`` runs on real CPU tensors, stopped before it outgrows the host's memory
  (``host_memory.py``); ``mode="auto"`` runs fake mode, and re-runs the code in real mode
  (``trace.meta["fallback"]`` says why) only where fake mode cannot go on and cannot guess
  (an op with no size rule on a large unknown tensor, a loop on a guessed value), and only
  if the host has the memory for it. A few hot ops (convolution, batch norm
  and their backwards, copies, simple in-place ops) take shortcuts in fake mode that give the
  outputs FakeTensorMode's kernels give, faster (``tests/tracing/test_tracer_fastpaths.py``).
* The tracer records what this CPU run does with the CUDA defaults it can see at trace
  time (tensors report ``cuda``, so optimizers pick ``foreach``). Two kernels are rewritten
  to allocate as on the target GPU: dropout (``native_dropout``'s bool mask) and
  ``scaled_dot_product_attention`` (the backend CUDA would pick for the target's compute
  capability, ``sdpa.py``); other differences (cuBLAS / cuDNN workspaces, autocast cast
  lists) are the business of ``xmem_engine/gpus/cuda_libraries.py``, for which each GPU
  convolution's cuDNN problems are recorded (``convolutions.py``). oneDNN is switched off so that real CPU execution takes
  the same generic kernels as fake tensors.
* Module hooks give the module path (dotted, relative to the top-level module; the
  top-level module's own ops carry its variable name, or its class name). Backward ops get
  the module that was running when their autograd node was made in the forward.
  Autograd's saved-tensor hooks tell which storages are saved for backward
  (``activation``); parameters, buffers, gradients and optimizer state are recognised from
  the modules and optimizers the code uses, and a storage's category only moves up
  (``_RANK``), so the last word is the most specific one. ``user source`` is the innermost
  frame outside torch, xmem and the standard library.
* Distributed scripts (``distributed.py``): with a ``World`` the code sees torchrun's
  environment for one rank, and ``init_process_group`` makes an in-process group of N ranks
  whose collectives fill their outputs in place; autograd's engine runs with the device mode
  on, so backward hooks (FSDP's) see the virtual device; ``UntypedStorage.resize_`` (FSDP's
  way of freeing unsharded parameters) is reported like an op's resize.
* ``torch.compile`` compiles for the target GPU (``torch_compile.py``): Dynamo, AOTAutograd and
  Inductor run on the CPU for ``cuda`` (where this torch has Triton; else compiled code runs
  eagerly, and the notes say why), and the wrapper code Inductor generates runs under the
  tracer, so the trace holds the compiled step's buffers.
* CPU-only conveniences: ``DataLoader`` workers load in-process, NVTX ranges and CUDA events do nothing, cuDNN is refused (RNNs run
  the CPU kernels in both modes, on a CUDA build of torch too), packed sequences keep their
  ``batch_sizes`` on the host (``packed_sequences.py``).

What persists in a namespace
----------------------------
When ``code`` is source text it runs in a copy of ``namespace``. Afterwards only *plain*
values that the code bound to names (``None``, bools, numbers, strings, bytes, and lists,
tuples, dicts and sets of those) are copied back; tensors, modules, optimizers, functions
and classes the code made stay behind (they may hold fake tensors or GPU storages). Objects
that existed before are restored to their earlier state (``user_state.py``): modules,
optimizers, tensors (binding, values, ``requires_grad``, ``.grad``), lists / dicts / sets
(so nothing appended during tracing stays), the RNG states and common global torch
settings. The same holds for what a callable reaches through its globals and closure.
The callable's return value is discarded.

Where things are
----------------
The spine, here:

``run.py``            :func:`trace`, the entry point: modes, fallback, the user's namespace
``tracer.py``         :class:`Tracer`: the record of one run (storages, categories, phases)
``scope.py``          trace modes, device kinds, the scope of the torch call now running
``alloc_mode.py``     the dispatch mode: aten ops -> allocations and frees
``device_mode.py``    the function mode: the virtual ``cuda`` device at the Python API
``virtual_cuda.py``   ``torch.cuda.*`` answered for the target GPU; autocast and GradScaler
``patches.py``        torch patched for the trace's duration (``nn.Module._apply``, DataLoader...)
``steady.py``         a cell's training step run until its memory is the training run's
``host_memory.py``    the host memory a real-mode run may take, and its guard
``user_state.py``     the user's objects and settings, put back after the trace
``script.py``         a training script run as ``python SCRIPT`` (``--set``: ``xmem_engine/overrides.py``)
``frames.py``         which frames are the user's (sources, tracebacks)
``errors.py``         what can go wrong; ``torch_compat.py``: what differs between torch releases
``ops.py``            the registry every rule table registers into: which ops are modelled, how
                      (``xmem ops``)

``kernels/``: CUDA behaviour the CPU run does not show, re-created for the target GPU

``sdpa.py``           ``scaled_dot_product_attention`` as the target GPU's backend allocates
``autocast_policy.py``  CUDA's autocast cast lists, applied on the CPU
``cuda_temporaries.py``  buffers CUDA kernels allocate for themselves (index_put's sort, reductions)
``cuda_reduce.py``    the reduction kernel's launch configuration and staging buffers (Reduce.cuh)
``einsum_lowering.py``  einsum as releases before 2.9 compose it (``torch_version``)
``grad_accumulation.py``  gradient sums in place, as CUDA's autograd does them
``convolutions.py``   each GPU convolution's cuDNN problem, for its workspace

``fake/``: values of fake tensors, and ops kept in fake mode

``shadow_values.py``  real values of small fake GPU tensors whose contents are known
``guesses.py``        values nobody knows, guessed; data-dependent sizes, bounded
``placeholders.py``   what ``.item()`` of a fake tensor gives
``fake_fastpaths.py``   shortcuts for hot ops in fake mode
``out_metas.py``      meta kernels for ``out=`` overloads torch ships without one

``shims/``: what keeps users' scripts running as on a GPU

``distributed.py``    one rank of a torchrun launch: its environment, a process group of N
                      ranks, DDP's reducer and FSDP's buffers on the virtual GPU
``subclasses.py``     wrapper subclasses (DTensor) seen through to the tensors they hold
``checkpoints.py``    ``torch.save`` / ``torch.load`` and safetensors on the virtual GPU
``packed_sequences.py``  ``pack_padded_sequence`` / ``pad_packed_sequence`` on the virtual GPU
``bitsandbytes_shim.py``  bitsandbytes (once imported): 4/8-bit parameters over fake data,
                      ``gemm_4bit``'s CUDA temporaries, paged optimizer states as unified memory
``triton_launches.py``  Triton kernels (Liger, TRL, a user's ``@triton.jit``): launches counted,
                      not compiled or run; the tensors they write lose their known values
``generation.py``     ``generate()`` at its worst: every beam to ``max_new_tokens``
``transformers_tracing.py``  transformers' "is this tensor traced?" answered as on a GPU
``unsloth_checks.py``  Unsloth's untrained-token check (reads weights' values) skipped on fake weights

``compiler/``: ``torch.compile`` for the target GPU

``torch_compile.py``  ``torch.compile`` under the tracer: Inductor's buffers, not eager code's
``inductor_gpu.py``   the target GPU as Dynamo, Inductor and Triton ask about it while compiling
``inductor_autotune.py``  what Inductor's timings allocate at a kernel's first launch
``compile_cache.py``  Inductor's compiled graphs kept between estimates, under a size limit
``python_autograd.py``  the autograd engine AOTAutograd's joint graph runs through while compiling
``recomputation.py``  a checkpoint's recomputation where its forward ran (inside a compiled call)
"""

from xmem_engine.tracing.errors import HostMemoryError, TracerError, UnsupportedOpError
from xmem_engine.tracing.frames import strip_to_user_code, user_traceback_lines
from xmem_engine.tracing.run import trace
from xmem_engine.trace import MODES, Mode
from xmem_engine.tracing.scope import Device
from xmem_engine.overrides import OverrideError, parse_overrides, top_level_value
from xmem_engine.tracing.script import trace_script
from xmem_engine.tracing.tracer import Tracer

__all__ = [
    "MODES",
    "Device",
    "HostMemoryError",
    "Mode",
    "OverrideError",
    "Tracer",
    "TracerError",
    "UnsupportedOpError",
    "parse_overrides",
    "strip_to_user_code",
    "top_level_value",
    "trace",
    "trace_script",
    "user_traceback_lines",
]
