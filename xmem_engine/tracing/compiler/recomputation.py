"""``torch.utils.checkpoint``'s recomputation in the context its forward ran in.

Why: a region checkpointed inside a compiled call (a Hugging Face layer with gradient
checkpointing, which Dynamo leaves to Python under the Trainer's ``torch_compile``) runs as
code does inside the call (``torch_compile.CompiledCalls.as_in_a_compiled_call``): attention is
the target GPU's fused kernel, as Dynamo sees it. Its recomputation runs in backward, out of the
call, where attention was the device mode's handler, which saves other tensors, and the
checkpoint stopped the script ("A different number of tensors was saved during the original
forward and recomputation"). On a GPU both are the same kernel.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from xmem_engine.tracing.patches import patched_attr

#: torch.utils.checkpoint's non-reentrant generator, by release (the first since 2.14)
GENERATORS = ("_checkpoint_without_reentrant_generator_impl", "_checkpoint_without_reentrant_generator")


def recomputed_as_run(calls: Any, generator: Callable[..., Any]) -> Callable[..., Any]:
    """``generator`` (it recomputes ``fn``) with ``fn`` recomputed where its forward ran:
    inside a compiled call, or with the functions as Dynamo sees them."""

    def checkpointed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        ran = calls.t.in_dynamo, calls.functions_on
        if any(ran):
            forward = fn

            def fn(*a: Any, **k: Any) -> Any:
                if (calls.t.in_dynamo, calls.functions_on) == ran:
                    return forward(*a, **k)
                with calls.as_in_a_compiled_call() if ran[0] else calls.functions_for_dynamo():
                    return forward(*a, **k)

        return generator(fn, *args, **kwargs)

    return checkpointed


@contextlib.contextmanager
def recomputed_as_forward_ran(calls: Any) -> Iterator[None]:
    import torch.utils.checkpoint as ckpt

    name = next((n for n in GENERATORS if hasattr(ckpt, n)), None)
    if name is None:
        yield
        return
    with patched_attr(ckpt, name, recomputed_as_run(calls, getattr(ckpt, name))):
        yield
