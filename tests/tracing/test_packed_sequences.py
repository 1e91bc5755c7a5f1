"""Packed sequences through an RNN: fake mode runs them (sized from the real lengths), and
fake and real traces agree event for event; batch_sizes and lengths stay host tensors."""

from __future__ import annotations

import pytest
import torch

from tests.tracing.test_shadow_values import alloc_stream
from xmem_engine.tracing import trace

PACKED = """
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
emb = nn.Embedding(50, 8).cuda()
rnn = nn.{cell}(8, 16, num_layers=2, batch_first=True, bidirectional=True).cuda()
lengths = torch.tensor([5, 3, 7, 2])
words = torch.randint(1, 50, (4, 7)).cuda()
packed = pack_padded_sequence(emb(words), lengths, batch_first=True, enforce_sorted=False)
out, _ = rnn(packed)
padded, lens = pad_packed_sequence(out, batch_first=True, total_length=9)
shape = tuple(padded.shape)
lens_list = lens.tolist()
devices = (str(packed.batch_sizes.device), str(lens.device), str(padded.device))
padded.sum().backward()
"""


@pytest.mark.parametrize("cell", ["LSTM", "GRU", "RNN"])
def test_packed_sequences_trace_alike_in_fake_and_real_mode(cell):
    runs = {}
    for mode in ("fake", "real"):
        ns: dict = {}
        runs[mode] = (trace(PACKED.format(cell=cell), ns, mode=mode), ns)
    (fake, fns), (real, rns) = runs["fake"], runs["real"]
    assert fake.mode == "fake" and "guesses" not in fake.meta
    assert fns["shape"] == rns["shape"] == (4, 9, 32) and fns["lens_list"] == rns["lens_list"] == [5, 3, 7, 2]
    assert fns["devices"] == rns["devices"] == ("cpu", "cpu", "cuda:0")
    assert alloc_stream(fake) == alloc_stream(real)


def test_a_too_short_total_length_is_the_error_torch_gives():
    src = PACKED.format(cell="LSTM").replace("total_length=9", "total_length=3")
    for mode in ("fake", "real"):
        with pytest.raises(ValueError, match="Expected total_length to be at least the length of the longest"):
            trace(src, {}, mode=mode)
