"""The generation shims' pieces that need no transformers: beam search's stop test across the
signatures transformers has had, and the affine family decode steps are made from."""

from __future__ import annotations

import pytest
import torch

from xmem_engine.affine import Linear, NotAffine, OutOfRange, evaluate, fit
from xmem_engine.tracing.shims.generation import _to_the_end


def _v4(running_beam_scores, beam_scores, is_sent_finished, next_token_hits_stopping_criteria, cur_len,
        max_length, decoder_prompt_len, early_stopping, length_penalty):
    """transformers 4.5x's signature (nine arguments)."""


def _v5(is_early_stop_heuristic_unsatisfied, is_sent_finished, next_token_hits_stopping_criteria,
        early_stopping=None):
    """transformers 5.x's."""


@pytest.mark.parametrize("original, args", [
    (_v4, (None, None, None, "HITS", 5, 20, 3, False, 1.0)),
    (_v5, (None, None, "HITS")),
    (_v5, (None, None, "HITS", True)),
])
def test_beam_search_stops_only_on_the_stopping_criteria_whatever_the_signature(original, args):
    stop = _to_the_end(original)
    for hits, unfinished in (([[False, True]], True), ([[True, True]], False)):
        a = tuple(torch.tensor(hits) if x == "HITS" else x for x in args)
        assert bool(stop(*a)) is unfinished


def test_a_family_is_a_line_in_each_integer_and_string_number():
    a = (("A", 100, (2, 10), "layers.3:10"), 7)
    b = (("A", 110, (2, 11), "layers.3:11"), 7)
    t = fit(a, b, 1, "call")
    assert t[0][1] == Linear(100, 10) and t[1] == 7
    assert evaluate(t, 5) == (("A", 150, (2, 15), "layers.3:15"), 7)
    with pytest.raises(OutOfRange):
        evaluate(t, -11)
    with pytest.raises(NotAffine):
        fit(a, (("B", 110, (2, 11), "layers.3:11"), 7), 1, "call")
