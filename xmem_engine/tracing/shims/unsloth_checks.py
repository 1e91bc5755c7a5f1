"""Unsloth's check of untrained token rows, answered in fake mode as a trained checkpoint answers it.

Unsloth's ``SFTTrainer`` (its generated ``UnslothSFTTrainer``) calls
``unsloth_zoo.tokenizer_utils.fix_untrained_tokens`` before training: it looks for rows of the
input embedding and the LM head that are all (near) zero or repeated, tokens a base checkpoint
never trained (Llama-3's reserved special tokens), and resets those the data uses to the mean of
the trained rows. It reads the weights' values: ``torch.where`` of a mask computed from them,
then ``.numpy()`` of the selected LM-head rows. Fake tensors carry no values; the selection's
size is a data-dependent one, guessed at its upper bound (every token: a vocabulary-sized copy of
the LM head), and its ``.numpy()`` cannot be answered at all, so the whole SFT script stopped.

In fake mode the check is skipped when the embedding is a fake tensor, and a note says so. What
it skips allocates little on a GPU: a few vocabulary-length vectors (``amax``/``amin`` per row,
the masks), the rows it selects, and, only where it finds untrained tokens the data uses, their
mean; it runs once, before the first step, far below the step's peak. A checkpoint whose tokens
are all trained (a random-initialised one, any instruct model) is unchanged by it on a GPU too.

Unsloth also tests tensors by exact type, ``type(x) is torch.Tensor``: the hook that makes the
embedding's output require gradients for gradient checkpointing (FastModel's, for Gemma 3 and
others) raises for anything else ("Neither loss, logits, nor last_hidden_state are available"),
and its collators and MoE helpers take other paths. A fake tensor stands for a plain GPU tensor,
so in those modules ``type`` answers ``torch.Tensor`` for one (a name of the module's own, which
its functions find before the builtin); everything else is the builtin's answer.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import sys
from typing import Any, Callable, Iterator

import torch

from xmem_engine.tracing.patches import on_import, patched_attr

#: where the check lives, and the Unsloth module that imports it by name
MODULES = ("unsloth_zoo.tokenizer_utils", "unsloth.tokenizer_utils")
NAME = "fix_untrained_tokens"

NOTE = ("Unsloth's fix_untrained_tokens (unsloth_zoo) was skipped: it reads the embedding's and LM head's "
        "values to find untrained token rows, which fake tensors do not have; a checkpoint whose tokens are "
        "all trained is unchanged by it, and what it allocates (a few vocabulary-length vectors, once, "
        "before training) is far below the step's peak")


#: Unsloth's modules that test ``type(x) is torch.Tensor``
EXACT_TYPE_MODULES = ("unsloth_zoo.peft_utils", "unsloth_zoo.dataset_utils", "unsloth_zoo.flex_attention.utils",
                      "unsloth_zoo.temporary_patches.gpt_oss", "unsloth_zoo.temporary_patches.moe_fused_swiglu",
                      "unsloth.models.vision")


class _AnswersAsOnGpu(builtins.type):
    """The stand-in's metaclass: only the stand-in itself answers differently from ``type``."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is not _type_as_on_gpu:  # a metaclass a module derives from the stand-in
            return super().__call__(*args, **kwargs)
        if len(args) == 3 and "__module__" not in args[2]:  # type(name, bases, namespace)
            args = (*args[:2], {**args[2], "__module__": sys._getframe(1).f_globals.get("__name__")})
        if len(args) != 1 or kwargs:
            return builtins.type(*args, **kwargs)
        from torch._subclasses.fake_tensor import FakeTensor

        found = builtins.type(args[0])
        return torch.Tensor if found is FakeTensor else found

    def __instancecheck__(cls, obj: Any) -> bool:
        if cls is _type_as_on_gpu:
            return isinstance(obj, builtins.type)
        return super().__instancecheck__(obj)

    def __subclasscheck__(cls, sub: Any) -> bool:
        if cls is _type_as_on_gpu:
            return issubclass(sub, builtins.type)
        return super().__subclasscheck__(sub)


class _type_as_on_gpu(builtins.type, metaclass=_AnswersAsOnGpu):
    """``type``, answering ``torch.Tensor`` for a fake tensor (what it stands for). A class, not a
    function: the same modules also ask ``isinstance(cls, type)`` (``train_on_responses_only``
    does), and that must stay the builtin's answer."""


def _skipped_when_fake(original: Callable[..., Any], tracer: Any) -> Callable[..., Any]:
    @functools.wraps(original)
    def fix_untrained_tokens(model: Any, *args: Any, **kwargs: Any) -> Any:
        get = getattr(model, "get_input_embeddings", None)
        try:
            weight = getattr(get(), "weight", None) if callable(get) else None
        except Exception:  # composite models without one embedding: Unsloth skips them itself
            weight = None
        if weight is None or not _is_fake(weight, tracer):
            return original(model, *args, **kwargs)
        if NOTE not in tracer.notes:
            tracer.notes.append(NOTE)
        return None

    fix_untrained_tokens.__xmem_original__ = original  # type: ignore[attr-defined]
    return fix_untrained_tokens


def _is_fake(t: Any, tracer: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor) and getattr(t, "fake_mode", None) is tracer.fake_mode


@contextlib.contextmanager
def unsloth_checks(tracer: Any, stack: contextlib.ExitStack) -> Iterator[None]:
    """While the trace lasts, in fake mode: Unsloth's untrained-token check skipped on fake weights,
    in the modules that hold it by name, and its exact-type tests answered for fake tensors, as the
    modules are imported (nothing is imported here)."""

    def patch(module: Any) -> None:
        original = getattr(module, NAME, None)
        if not tracer.fake or not callable(original):
            return
        if hasattr(original, "__xmem_original__"):  # imported by name from a module patched before it
            stack.callback(setattr, module, NAME, original.__xmem_original__)
        else:
            stack.enter_context(patched_attr(module, NAME, _skipped_when_fake(original, tracer)))

    def exact_types(module: Any) -> None:
        if tracer.fake and "type" not in vars(module):
            stack.enter_context(patched_attr(module, "type", _type_as_on_gpu))

    with on_import(MODULES, patch), on_import(EXACT_TYPE_MODULES, exact_types):
        yield
