"""What can go wrong while tracing, as exceptions.

Two families: :class:`TracerError` (the tracer could not produce a trace: an op the mode
cannot run, a bad ``--set``) is shown to the user as xmem's message; ``BaseException``
subclasses (:class:`StopTracing`, :class:`NeedsRealValues`) are the tracer's own control
flow, which a user's ``except Exception`` must not swallow.
"""

from __future__ import annotations

from xmem_engine.tracing.frames import is_user_file


class TracerError(Exception):
    """The tracer could not produce a trace (not an error of the user's code)."""

    def _render_traceback_(self) -> list[str]:
        """IPython's hook for an exception's display: the message, which names the user's line,
        without the frames of IPython's magic and the tracer above it."""
        return [f"{type(self).__name__}: {self}"]


class UnsupportedOpError(TracerError):
    """An op or a value read the chosen mode cannot execute."""

    def __init__(self, op: str, mode: str, reason: str = "", where: str = "", hint: str | None = None):
        self.op, self.mode, self.reason, self.where = op, mode, reason, where
        if hint is None:
            hint = "try --mode real (runs the code on real CPU tensors)" if mode == "fake" else (
                "report it to xmem with the line above"
            )
        at = f" at {where}" if where else ""
        why = f" ({reason})" if reason else ""
        super().__init__(f"{op}{at} cannot be traced in {mode} mode{why}; {hint}")


class HostMemoryError(TracerError):
    """A real-mode run was stopped, or not started, because this machine lacks the host
    memory its real tensors need (``host_memory.py``): nothing was killed."""


class StopTracing(BaseException):
    """Raised at the start of the iteration after ``max_iterations``: the code has shown its
    steady state; the rest of it need not run."""


# Fake tensors keep a sparse tensor's shape, not its entries: what sparse ops make from one
# (a transpose, a coalesce, a sum) has none, and takes no memory.
SPARSE_REASON = "fake tensors keep no entries of a sparse tensor, so what is made from one takes no memory"


# torch's own fake tensors (plain FakeTensorMode too) lose a tensor to the meta device in the
# backward of forward-mode AD under vmap (``vmap(torch.func.hessian(f))``, a PINN's Laplacian):
# "found at least two devices, meta and cpu". Real tensors run it.
META_LEAK_REASON = ("torch's fake tensors put a tensor of this op on the meta device (the backward of "
                    "forward-mode AD under vmap, as vmap(torch.func.hessian(...)) makes)")


def is_meta_leak(e: BaseException) -> bool:
    """FakeTensorMode's device check failing on a meta tensor it made itself: the user's code
    meets no meta tensor there (its own meta tensors are not fake, and fail another check).
    torch 2.10 says "Unhandled FakeTensor Device Propagation ... meta, cpu" instead."""
    msg = str(e)
    return "meta" in msg and (type(e).__name__ == "FakeTensorDeviceMismatchError"
                              or "FakeTensor Device Propagation" in msg)


class NeedsRealValues(BaseException):
    """Fake tensors cannot go on: the code needs tensor values. A BaseException so that a
    user's ``except Exception`` cannot swallow it."""

    def __init__(self, op: str, reason: str, where: str = ""):
        super().__init__(op, reason, where)
        self.op, self.reason, self.where = op, reason, where
        self.gpu_bytes = 0  # the most the aborted fake attempt held on the GPU: a real run needs more


_NO_CUDA_MESSAGES = ("not compiled with CUDA", "not linked with support for cuda", "no NVIDIA driver",
                     "hasPrimaryContext", "CUDA driver", "cuda runtime", "ATen_cuda", "CUDA build")


#: torch._C's CUDA-only bindings, which the CPU wheel lacks
_CUDA_BINDINGS = ("_cuda_", "_nccl_", "_cudnn_")


def needs_real_gpu(e: BaseException, mode: str) -> UnsupportedOpError | None:
    """A failure of this machine's missing GPU rather than of the user's code: name the
    torch function the user's code called that needs it."""
    msg = str(e)
    # (the CPU wheel has no CUDA bindings at all: "module 'torch._C' has no attribute '_cuda_...'")
    missing_binding = isinstance(e, AttributeError) and any(f"has no attribute '{p}" in msg for p in _CUDA_BINDINGS)
    if not missing_binding and (not isinstance(e, (RuntimeError, AssertionError))
                                or not any(m.lower() in msg.lower() for m in _NO_CUDA_MESSAGES)):
        return None
    op, where = "a CUDA-only call", ""
    tb = e.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if is_user_file(code.co_filename):
            where = f"{code.co_filename}:{tb.tb_lineno}"
        elif where:
            module = tb.tb_frame.f_globals.get("__name__", "")
            op = f"{module}.{code.co_name}" if module else code.co_name
            break
        tb = tb.tb_next
    return UnsupportedOpError(op, mode, msg.splitlines()[0] if msg else "", where,
                              hint="it needs a real GPU, which the virtual device does not emulate; "
                              "remove the call from the traced code")


#: accelerate's words for a state object whose shared state was reset (``patches.fresh_singletons``)
_RESET_STATE = "was called and an `Accelerator` or `PartialState` was not reinitialized"


def made_before_the_trace(e: BaseException) -> TracerError | None:
    """An accelerate object made before the traced code (an ``Accelerator``, a Trainer's
    ``TrainingArguments``, in an earlier notebook cell) met the new process's state a trace
    starts with: it was made for this machine's device (``cpu`` without a GPU), and accelerate's own
    message speaks of ``_reset_state()``. Say what to do instead."""
    if not isinstance(e, AttributeError) or _RESET_STATE not in str(e):
        return None
    where = ""
    tb = e.__traceback__
    while tb is not None:
        if is_user_file(tb.tb_frame.f_code.co_filename):
            where = f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return TracerError(
        f"an object the traced code uses{where} was made before it (a Trainer, its TrainingArguments or an "
        "Accelerator from an earlier cell): it was made for this machine's device, not the virtual GPU, and "
        "holds accelerate's state of this process, which a trace does not share. Make it inside the traced "
        "code (the %%xmem cell) so that it is made for the virtual GPU")
