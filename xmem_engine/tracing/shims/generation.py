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
import inspect
from typing import Any, Callable

import torch

from xmem_engine.tracing.patches import on_import, patched_attr
from xmem_engine.tracing.shims import decode_replay

#: the module that holds ``GenerationMixin`` (transformers 4.4x to 5.x)
GENERATION_MODULE = "transformers.generation.utils"
#: the module that holds ``PreTrainedModel`` (its ``get_compiled_call``: generate's own compile)
MODELING_MODULE = "transformers.modeling_utils"


def _to_the_end(has_unfinished: Callable[..., Any]) -> Callable[..., torch.Tensor]:
    """``GenerationMixin._beam_search_has_unfinished_sequences`` without the parts decided by
    guessed scores and tokens: only the stopping criteria end the search. Its arguments are
    taken by name (transformers 4.5x passes nine, 5.x three or four)."""
    signature = inspect.signature(has_unfinished)

    def unfinished(*args: Any, **kwargs: Any) -> torch.Tensor:
        hits = signature.bind(*args, **kwargs).arguments["next_token_hits_stopping_criteria"]
        return ~torch.all(hits)

    return unfinished


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


class _Replays:
    """The decode steps made from their pattern in this trace, over all ``generate()`` calls
    (``decode_replay.py``), told in one note."""

    def __init__(self, tracer: Any):
        self.tracer = tracer
        self.active: dict[int, decode_replay.DecodeReplay] = {}  # id(model) -> its generate()'s wrapper
        self.compiled: dict[int, list] = {}  # id(model) -> wrappers of its compiled decode step, this generate()
        self.made = self.calls = 0
        self.diverged: list[str] = []
        self.note_at: int | None = None

    def generate(self, generate: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(generate)
        def run(model: Any, *args: Any, **kwargs: Any) -> Any:
            if id(model) in self.active or not decode_replay.enabled():
                return generate(model, *args, **kwargs)
            with decode_replay.wrapped_forward(self.tracer, model) as replay:
                self.active[id(model)] = replay
                try:
                    return generate(model, *args, **kwargs)
                finally:
                    del self.active[id(model)]
                    self._tell(replay)
                    for inner in self.compiled.pop(id(model), ()):
                        self._tell(inner)
                        inner.release()

        return run

    def compile_criteria(self, criteria: Callable[..., Any]) -> Callable[..., Any]:
        """``generate`` compiles its decode step itself (a static cache): the compiler must
        see the model's own ``forward``, so the wrapper steps aside."""

        @functools.wraps(criteria)
        def run(model: Any, *args: Any, **kwargs: Any) -> Any:
            ok = criteria(model, *args, **kwargs)
            if ok and id(model) in self.active:
                self.active[id(model)].set_aside()
            return ok

        return run

    def compiled_call(self, get_compiled_call: Callable[..., Any]) -> Callable[..., Any]:
        """``PreTrainedModel.get_compiled_call``: the decode step ``generate`` compiles (a static
        cache's) wrapped in turn, the compiled call being what runs a step."""

        @functools.wraps(get_compiled_call)
        def run(model: Any, *args: Any, **kwargs: Any) -> Any:
            call = get_compiled_call(model, *args, **kwargs)
            if id(model) not in self.active:
                return call
            inner = decode_replay.DecodeReplay(self.tracer, call)
            self.compiled.setdefault(id(model), []).append(inner)
            return inner

        return run

    def _tell(self, replay: decode_replay.DecodeReplay) -> None:
        self.made += replay.made
        self.calls += replay.calls
        self.diverged += replay.diverged
        if not self.made and not self.diverged:
            return
        note = (f"generate(): {self.made:,} of {self.calls:,} calls of the model were made from the pattern of "
                f"the calls before them, not run (each request's size a straight line in the call's number; "
                f"real calls at intervals checked it")
        if self.diverged:
            note += (f", and one did not match: the calls made before it (numbers {', '.join(self.diverged)} of "
                     f"their generate()) may differ from a real run's")
        note += f"). {decode_replay.ENV}=0 runs every call"
        notes = self.tracer.notes
        if self.note_at is None or self.note_at >= len(notes):
            self.note_at = len(notes)
            notes.append(note)
        else:
            notes[self.note_at] = note


def generation_in_fake_mode(tracer: Any, stack: contextlib.ExitStack) -> contextlib.AbstractContextManager:
    """While the trace lasts, in fake mode: beam search runs to ``max_new_tokens`` (module
    docstring), and decode steps are made from their pattern (``decode_replay.py``).
    transformers is patched when the traced code imports it, and put back after."""

    replays = _Replays(tracer)

    def patch(module: Any) -> None:
        if not tracer.fake:
            return
        if module.__name__ == MODELING_MODULE:
            model = getattr(module, "PreTrainedModel", None)
            if model is not None and hasattr(model, "get_compiled_call"):
                stack.enter_context(patched_attr(model, "get_compiled_call",
                                                 replays.compiled_call(model.get_compiled_call)))
            return
        mixin = getattr(module, "GenerationMixin", None)
        if mixin is None:
            return
        if hasattr(mixin, "_beam_search_has_unfinished_sequences"):
            stack.enter_context(patched_attr(mixin, "_beam_search_has_unfinished_sequences",
                                             staticmethod(_to_the_end(mixin._beam_search_has_unfinished_sequences))))
            if hasattr(mixin, "_beam_search"):
                stack.enter_context(patched_attr(mixin, "_beam_search", uncropped(mixin._beam_search)))
        stack.enter_context(patched_attr(mixin, "generate", replays.generate(mixin.generate)))
        if hasattr(mixin, "_valid_auto_compile_criteria"):
            stack.enter_context(patched_attr(mixin, "_valid_auto_compile_criteria",
                                             replays.compile_criteria(mixin._valid_auto_compile_criteria)))

    return on_import([GENERATION_MODULE, MODELING_MODULE], patch)
