"""A decode step's output as a recipe (tracing/shims/decode_forms.py) and made again from it
(decode_replay.py), for a cache kept in the model's own buffers and passed as lists of views,
as Unsloth's fast decoding passes it. (The whole of it, generate() with Unsloth's model, is
tests/unsloth_notebook/test_unsloth_generate.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import torch.utils._pytree as pytree

from xmem_engine.tracing.shims.decode_forms import NotReplayable, _output_recipe, signature
from xmem_engine.tracing.shims.decode_replay import _build, _views_fit

ROWS, HEADS, DIM = 12, 2, 4


def _buffer() -> torch.Tensor:
    """A layer's keys and values, as Unsloth keeps them: (rows, 2, batch, heads, dim)."""
    return torch.zeros(ROWS, 2, 1, HEADS, DIM)


def _views(buf: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    return buf[:length, 0].permute(1, 2, 0, 3), buf[:length, 1].permute(1, 2, 0, 3)


class Cache:
    """A cache object (its state is its attributes)."""


def test_a_list_cache_of_views_is_read_and_made_again():
    buffers = [_buffer(), _buffer()]
    kwargs = {"past_key_values": [_views(b, 5) for b in buffers], "position_ids": torch.zeros(1, 1)}
    out = {"logits": torch.zeros(1, 1, 8), "past_key_values": [_views(b, 6) for b in buffers], "hidden_states": []}
    step = SimpleNamespace(live={})  # the tracer: nothing of it was made by the step but the logits
    with pytest.raises(NotReplayable, match="logits"):
        _output_recipe(step, out, (), kwargs, set(), {})
    out["logits"] = kwargs["position_ids"]  # an argument handed back
    cls, parts = _output_recipe(step, out, (), kwargs, set(), {})
    assert cls is dict and dict(parts)["logits"] == ("arg", "position_ids")
    assert dict(parts)["hidden_states"] == ("seq", list, ())
    cache = dict(parts)["past_key_values"]
    assert cache[0] == "seq" and cache[1] is list and len(cache[2]) == 2
    key_view = cache[2][1][2][0]  # layer 1's keys
    assert key_view == ("view", ("past_key_values", 1, 0), (1, HEADS, 6, DIM), (HEADS * DIM, DIM, 2 * HEADS * DIM, 1), 0)

    made = {key: _build(how, {}, (), kwargs) for key, how in parts}
    for (k, v), (k2, v2) in zip(made["past_key_values"], out["past_key_values"]):
        for a, b in ((k, k2), (v, v2)):
            assert a.untyped_storage()._cdata == b.untyped_storage()._cdata  # the layer's own buffer
            assert (a.shape, a.stride(), a.storage_offset()) == (b.shape, b.stride(), b.storage_offset())
    assert made["hidden_states"] == [] and made["hidden_states"] is not out["hidden_states"]


def test_a_step_that_would_outgrow_the_buffer_is_not_made():
    buffers = [_buffer()]
    kwargs = {"past_key_values": [_views(b, 5) for b in buffers]}

    def recipe(length: int) -> tuple:
        out = {"past_key_values": [_views(b, length) for b in buffers]}
        return _output_recipe(SimpleNamespace(live={}), out, (), kwargs, set(), {})

    assert _views_fit(recipe(ROWS), (), kwargs)  # every row of the buffer
    grown = (dict, (("past_key_values", ("seq", list, (("seq", tuple, (
        ("view", ("past_key_values", 0, 0), (1, HEADS, ROWS + 1, DIM), (HEADS * DIM, DIM, 2 * HEADS * DIM, 1), 0),
        ("view", ("past_key_values", 0, 1), (1, HEADS, ROWS + 1, DIM), (HEADS * DIM, DIM, 2 * HEADS * DIM, 1),
         HEADS * DIM))),))),))
    assert grown[1][0][1][2][0][2][0][2] == recipe(ROWS)[1][0][1][2][0][2][0][2][:2] + (ROWS + 1, DIM)
    assert not _views_fit(grown, (), kwargs)  # one row more than the buffer has


def test_lists_in_the_inputs_hold_tensors_and_values_not_state():
    sig = signature((), {"past_key_values": [(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))], "n": 3})
    assert sig[1][1] == ("past_key_values", ("list", (("tuple", (("T", (1, 2, 3, 4), (24, 12, 4, 1), "torch.float32",
                                                                    "cpu"),) * 2),)))
    assert signature((Cache(),), {})[0] == (("O", "Cache"),)  # a state object is read as the call's argument
    with pytest.raises(NotReplayable, match="Cache in a list"):  # but not inside a list: the step may change it
        signature((), {"caches": [Cache()]})
    masks = {"sliding_attention": torch.zeros(1, 1, 1, 6, dtype=torch.bool), "full_attention": None}
    assert signature((), {"attention_mask": masks})[1][0] == (
        "attention_mask", ("dict", (("full_attention", None),
                                    ("sliding_attention", ("T", (1, 1, 1, 6), (6, 6, 6, 1), "torch.bool", "cpu")))))


def test_flex_attention_block_masks_are_read_as_values():
    """Gemma 3 under Unsloth on a GPU with bf16 gets flex attention: generate() passes its masks
    by layer type as ``BlockMask``s. They are values (lengths, block size, tensors, mask
    function), so that two steps a token apart differ only in integers; the number of key
    blocks grows every 128 tokens, where the signature changes shape."""
    fa = pytest.importorskip("torch.nn.attention.flex_attention")

    def causal(b, h, q, kv):
        return q >= kv

    def masks(length: int) -> dict:
        m = fa.create_block_mask(causal, 1, None, 1, length, device="cpu")
        return {"full_attention": m, "sliding_attention": m}

    def sig(length: int) -> tuple:
        return signature((), {"attention_mask": masks(length), "n": length})

    def block_mask(s: tuple) -> tuple:  # the full-attention layers' mask
        return dict(dict(s[1])["attention_mask"][1])["full_attention"]

    def numbers(s: tuple) -> list:
        return [x for x in pytree.tree_leaves(s) if type(x) is int]

    a, b, c = sig(200), sig(201), sig(257)
    assert block_mask(a)[:3] == ("BlockMask", (1, 200), (128, 128))
    kv_indices = block_mask(a)[4][1]
    assert kv_indices[:2] == ("T", (1, 1, 1, 2))  # two blocks of 128 keys
    # a token later: the same but for integers
    assert pytree.tree_structure(a) == pytree.tree_structure(b) and numbers(a) != numbers(b)
    assert [x for x in pytree.tree_leaves(a) if type(x) is not int] == [x for x in pytree.tree_leaves(b) if type(x) is not int]
    assert block_mask(c)[4][1][1] == (1, 1, 1, 3)  # past 256 keys: a third block
