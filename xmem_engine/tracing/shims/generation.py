"""``generate()`` as a GPU runs it at its worst: every beam to ``max_new_tokens``.

Fake tensors carry no values, so the tokens a model generates and the scores beam search
keeps are guesses (``guesses.py``). Greedy search and sampling stop on a stop token, which a
guessed token never is (``Guesses._unequal``): they run to ``max_new_tokens``, the GPU's largest
KV cache. Beam search also stops when its early-stop heuristic, comparing the scores of running
and finished beams, says no running beam can still win. Those scores are guessed (``-1e9``
sentinels against reductions of guessed log-probabilities), and the loop ended after a step or
two: the estimate was a short generation's.

Here, in fake mode, beam search continues while its stopping criteria (``max_length``,
``max_time``, stop strings, on known values) let any beam continue, as on a GPU where no beam
finishes early, and returns its sequences uncropped: transformers crops them to the longest
finished beam, a count of guessed beam indices (0), where such a GPU returns every row to
``max_length``. The crop is a view of the full rows, so the rows are viewed whole again; what
the caller does next (decode, score the sequences with another model) sees the GPU's length.
Real mode runs on real scores and is left alone.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable

import torch

from xmem_engine.tracing.patches import on_import, patched_attr

#: the module that holds ``GenerationMixin`` (transformers 4.4x to 5.x)
GENERATION_MODULE = "transformers.generation.utils"


def _to_the_end(is_early_stop_heuristic_unsatisfied: Any, is_sent_finished: Any,
                next_token_hits_stopping_criteria: torch.Tensor, early_stopping: Any = None) -> torch.Tensor:
    """``GenerationMixin._beam_search_has_unfinished_sequences`` without the parts decided by
    guessed scores and tokens: only the stopping criteria end the search."""
    return ~torch.all(next_token_hits_stopping_criteria)


def whole_rows(t: Any, width: int) -> Any:
    """A 2-d view cropped along its rows (``x[:, :n]``, rows contiguous) widened to ``width``
    columns where its storage holds them; anything else as it is."""
    if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.stride(1) != 1 or t.shape[0] == 0:
        return t
    if width <= t.shape[1] or t.stride(0) < width:
        return t
    end = t.storage_offset() + (t.shape[0] - 1) * t.stride(0) + width
    if end * t.element_size() > t.untyped_storage().nbytes():
        return t
    return t.as_strided((t.shape[0], width), (t.stride(0), 1), t.storage_offset())


def uncropped(beam_search: Callable[..., Any]) -> Callable[..., Any]:
    """``GenerationMixin._beam_search`` returning its sequences (and beam indices) as wide as
    its ``generation_config.max_length``, as when every beam runs to the end."""

    @functools.wraps(beam_search)
    def run(self: Any, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = beam_search(self, input_ids, *args, **kwargs)
        config = kwargs.get("generation_config")
        if config is None:
            config = next((a for a in args if type(a).__name__ == "GenerationConfig"), None)
        max_length = getattr(config, "max_length", None)
        if not isinstance(max_length, int):
            return out
        widths = {"sequences": max_length, "beam_indices": max_length - input_ids.shape[-1]}
        if isinstance(out, torch.Tensor):
            return whole_rows(out, max_length)
        for name, width in widths.items():
            if getattr(out, name, None) is not None:
                out[name] = whole_rows(out[name], width)
        return out

    return run


def beam_search_to_the_end(tracer: Any, stack: contextlib.ExitStack) -> contextlib.AbstractContextManager:
    """While the trace lasts, in fake mode: beam search runs to ``max_new_tokens`` (module
    docstring). transformers is patched when the traced code imports it, and put back after."""

    def patch(module: Any) -> None:
        mixin = getattr(module, "GenerationMixin", None)
        if tracer.fake and mixin is not None and hasattr(mixin, "_beam_search_has_unfinished_sequences"):
            stack.enter_context(patched_attr(mixin, "_beam_search_has_unfinished_sequences",
                                             staticmethod(_to_the_end)))
            if hasattr(mixin, "_beam_search"):
                stack.enter_context(patched_attr(mixin, "_beam_search", uncropped(mixin._beam_search)))

    return on_import([GENERATION_MODULE], patch)
