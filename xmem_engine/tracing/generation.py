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
finishes early. Real mode runs on real scores and is left alone.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from xmem_engine.tracing.patches import on_import, patched_attr

#: the module that holds ``GenerationMixin`` (transformers 4.4x to 5.x)
GENERATION_MODULE = "transformers.generation.utils"


def _to_the_end(is_early_stop_heuristic_unsatisfied: Any, is_sent_finished: Any,
                next_token_hits_stopping_criteria: torch.Tensor, early_stopping: Any = None) -> torch.Tensor:
    """``GenerationMixin._beam_search_has_unfinished_sequences`` without the parts decided by
    guessed scores and tokens: only the stopping criteria end the search."""
    return ~torch.all(next_token_hits_stopping_criteria)


def beam_search_to_the_end(tracer: Any, stack: contextlib.ExitStack) -> contextlib.AbstractContextManager:
    """While the trace lasts, in fake mode: beam search runs to ``max_new_tokens`` (module
    docstring). transformers is patched when the traced code imports it, and put back after."""

    def patch(module: Any) -> None:
        mixin = getattr(module, "GenerationMixin", None)
        if tracer.fake and mixin is not None and hasattr(mixin, "_beam_search_has_unfinished_sequences"):
            stack.enter_context(patched_attr(mixin, "_beam_search_has_unfinished_sequences",
                                             staticmethod(_to_the_end)))

    return on_import([GENERATION_MODULE], patch)
