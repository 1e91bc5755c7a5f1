"""generate() in fake mode (issue #31, item 5): tokens are unknown values, and the loop runs
to max_new_tokens (no early stop token: the most a GPU allocates), whatever the eos id."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from tests.tracing.test_shadow_values import alloc_stream  # noqa: E402
from xmem_engine.tracing import trace  # noqa: E402

GENERATE = """
import torch
from transformers import LlamaConfig, AutoModelForCausalLM
cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512)
model = AutoModelForCausalLM.from_config(cfg).cuda().eval()
ids = torch.randint(3, 512, (4, 16), device="cuda")
with torch.no_grad():
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                         min_new_tokens=0, pad_token_id=EOS, eos_token_id=EOS, KW)
shape = tuple(out.shape)
"""


@pytest.mark.parametrize("eos", [0, 1, 2])
@pytest.mark.parametrize("kw", ["do_sample=False", "do_sample=True, top_k=50, top_p=0.9, temperature=0.7"])
def test_generation_runs_to_max_new_tokens_whatever_the_eos_id(eos, kw):
    """Guessed as ones, a sampled token is 1 and a greedy one argmax(ones) = 0: with eos 0 or 1
    generation stopped after one token. Unknown ids now match no stop token."""
    ns: dict = {}
    tr = trace(GENERATE.replace("EOS", str(eos)).replace("KW", kw), ns, mode="fake")
    assert tr.mode == "fake" and ns["shape"] == (4, 16 + 8)
    assert any(g["kind"] == "rule" and g["what"].startswith("isin") for g in tr.meta["guesses"])


# --------------------------------------------------------------------------- the KV cache
# A small Llama: B sequences of P prompt tokens, L layers, KV heads of D dims, bf16 (2 bytes).
B, P, L, KV, D, NEW = 3, 10, 3, 2, 16, 6
CACHE = f"""
import torch
from transformers import LlamaConfig, AutoModelForCausalLM
cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers={L}, num_attention_heads=4,
                  num_key_value_heads={KV}, head_dim={D}, vocab_size=384)
model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).cuda().eval()
ids = torch.randint(3, 384, ({B}, {P}), device="cuda")
with torch.no_grad():
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW,
                         min_new_tokens=0, pad_token_id=0, eos_token_id=2, return_dict_in_generate=True, KW)
shape = tuple(out.sequences.shape)
"""


def _generate(new: int = NEW, kw: str = "do_sample=False"):
    ns: dict = {}
    tr = trace(CACHE.replace("=NEW", f"={new}").replace("KW", kw), ns, mode="fake")
    assert tr.mode == "fake"
    return tr, ns


def _cache_allocs(tr, width: int, tokens: int) -> list:
    """The allocations shaped as one layer's keys or values: [width, KV, tokens, D], bf16."""
    return [e for e in tr.events if e.kind == "alloc" and e.shape == (width, KV, tokens, D)
            and e.dtype == "bfloat16"]


def _live_at_end(tr) -> dict:
    """id -> alloc event, for the allocations live at the last one: the end of the code, less
    the frees after it (the trace frees everything left when the code ends)."""
    events = list(tr.events)
    last = max(i for i, e in enumerate(events) if e.kind == "alloc")
    live: dict = {}
    for e in events[:last + 1]:
        if e.kind == "alloc":
            live[e.id] = e
        elif e.kind == "free":
            live.pop(e.id, None)
    return live


def test_dynamic_cache_at_the_end_is_the_formula():
    """DynamicLayer.update is ``torch.cat([keys, new], dim=-2)``: each step allocates the
    layer's keys and values one token longer and frees the old ones. The last token is
    generated but never fed back, so the cache holds P + NEW - 1 tokens: live at the end,
    2 x layers tensors of B x KV x (P + NEW - 1) x D x 2 bytes, nothing more of that shape."""
    tr, ns = _generate()
    assert ns["shape"] == (B, P + NEW)
    tokens = P + NEW - 1
    live = [e for e in _live_at_end(tr).values() if e.shape == (B, KV, tokens, D) and e.dtype == "bfloat16"]
    assert len(live) == 2 * L
    assert sum(e.bytes for e in live) == 2 * L * KV * D * tokens * B * 2
    # one cat per layer, keys and values, per forward pass: the prefill's P tokens, then one more each step
    for t in range(P, tokens + 1):
        assert len(_cache_allocs(tr, B, t)) >= 2 * L, t


def test_dynamic_cache_grows_by_the_formula_per_token():
    """Between max_new_tokens = N and N + k, the cache left at the end differs by k tokens:
    2 x layers x KV x D x B x 2 bytes each."""
    def cache_bytes(new: int) -> int:
        tr, _ = _generate(new)
        return sum(e.bytes for e in _live_at_end(tr).values()
                   if len(e.shape) == 4 and e.shape[0] == B and e.shape[1] == KV and e.shape[3] == D)

    assert cache_bytes(NEW + 3) - cache_bytes(NEW) == 3 * (2 * L * KV * D * B * 2)


def test_offloaded_cache_keeps_one_layer_on_the_gpu():
    """``cache_implementation="offloaded"``: each layer's keys and values go to the host after its
    update and the next layer's come back on a prefetch stream (``torch.Stream()``, made on the
    virtual GPU; it asked the driver). At the end one layer is on the GPU, where the dynamic
    cache holds all of them."""
    tr, ns = _generate(kw='cache_implementation="offloaded"')
    assert ns["shape"] == (B, P + NEW)
    tokens = P + NEW - 1
    live = [e for e in _live_at_end(tr).values() if e.shape == (B, KV, tokens, D) and e.dtype == "bfloat16"]
    assert len(live) == 2  # one layer's keys and values (the dynamic cache: 2 x L)
    assert {e.stream for e in live} != {0}  # brought back on the prefetch stream


def test_static_cache_is_allocated_once_at_its_full_length():
    """StaticLayer.lazy_initialization: ``torch.zeros((B, KV, max_cache_len, D))`` for keys and
    values of each layer at the prefill, written in place with index_copy_ after. generate()
    sizes it max_length - 1 = P + NEW - 1; nothing of a cache's shape is allocated after."""
    tr, ns = _generate(kw='cache_implementation="static"')
    assert ns["shape"] == (B, P + NEW)
    full = _cache_allocs(tr, B, P + NEW - 1)
    assert len(full) == 2 * L
    assert all(e.bytes == B * KV * (P + NEW - 1) * D * 2 for e in full)
    assert {e.op for e in full} == {"aten.zeros.default"}  # StaticLayer.lazy_initialization's torch.zeros
    assert sum(e.bytes for e in _live_at_end(tr).values() if e in full) == 2 * L * KV * D * (P + NEW - 1) * B * 2
    assert not _cache_allocs(tr, B, P + NEW - 2)  # no growing copies
    # generate() compiles the decode step with mode="reduce-overhead": CUDA graph trees warm it up,
    # record it and replay it in their private pool (the static cache is a static input: not copied)
    graphs = tr.meta["compile"]["cuda_graphs"]
    assert graphs["graphs"] == graphs["recorded"] == 1 and graphs["replays"] == NEW - 3, graphs
    assert not [e for e in full if e.stream != 0]  # the cache itself is the prefill's, outside the pool


def _beam_cache(tr, width: int) -> list:
    """The live cache at the end, by layer tensor: [width, KV, tokens, D], bf16, any length."""
    return [e for e in _live_at_end(tr).values() if len(e.shape) == 4 and e.shape[0] == width
            and e.shape[1] == KV and e.shape[3] == D and e.dtype == "bfloat16"]


def test_beam_search_cache_is_batch_times_beams_wide():
    """num_beams=4: the inputs are expanded to B x 4 rows before the first forward, and the
    cache is reordered by beam each step (index_select: a fresh tensor per layer). Whatever
    step it stopped at, the cache is 2 x layers tensors B x 4 wide, of the formula's bytes."""
    beams = 4
    tr, ns = _generate(kw=f"num_beams={beams}, do_sample=False")
    assert ns["shape"][0] == B
    live = _beam_cache(tr, B * beams)
    assert len(live) == 2 * L and len({e.shape for e in live}) == 1
    tokens = live[0].shape[2]
    assert P <= tokens <= P + NEW - 1
    assert sum(e.bytes for e in live) == 2 * L * KV * D * tokens * B * beams * 2
    assert not _beam_cache(tr, B)  # never B wide


def test_beam_search_runs_to_max_new_tokens():
    """The GPU's worst case, as for greedy and sampling: every beam runs to max_new_tokens. Beam
    search's early-stop heuristic compares guessed scores (``tracing/shims/generation.py``); it ended
    the search after a step or two before."""
    tr, _ = _generate(kw="num_beams=4, do_sample=False")
    assert {e.shape[2] for e in _beam_cache(tr, B * 4)} == {P + NEW - 1}
    assert not any(g["inside"].endswith(":3866") for g in tr.meta["guesses"] if g["what"] == "bool(tensor)"
                   and g["value"] == "False")  # never "no beam can continue"


def test_beam_search_returns_sequences_of_max_new_tokens():
    """transformers crops the sequences to the finished beams' longest, a count of guessed beam
    indices (0 here); a GPU whose beams all run to max_new_tokens returns P + NEW columns."""
    _, ns = _generate(kw="num_beams=4, do_sample=False")
    assert ns["shape"] == (B, P + NEW)


def test_whole_rows_undoes_a_column_crop_only():
    import torch

    from xmem_engine.tracing.shims.generation import whole_rows

    x = torch.arange(24).view(4, 6)
    assert torch.equal(whole_rows(x[:, :2], 6), x)
    assert whole_rows(x[1:3, :2], 6).shape == (2, 6)
    assert whole_rows(x, 6) is x and whole_rows(x[:, :2], 7).shape == (4, 2)  # wider than its rows
    assert whole_rows(x.t(), 9) .shape == (6, 4)  # rows not contiguous
    beams = torch.arange(2 * 3 * 5).view(2, 3, 5)[:, :1, :].reshape(2, 5)[:, :2]  # rows 15 apart
    assert torch.equal(whole_rows(beams, 5), torch.tensor([[0, 1, 2, 3, 4], [15, 16, 17, 18, 19]]))


def test_generate_in_a_thread_with_a_streamer_is_traced_as_in_the_code_s_own():
    """A chat demo's form: ``generate`` in a thread, its tokens read from a
    ``TextIteratorStreamer`` in the main one (a streamer takes one sequence). The thread ran
    outside the trace's modes and stopped at its first value read, leaving the main thread
    waiting for ever."""
    one = CACHE.replace(f"({B}, {P})", f"(1, {P})").replace("=NEW", f"={NEW}").replace("KW", "do_sample=False")
    threaded = one.replace("with torch.no_grad():\n    out = model.generate(", """
from threading import Thread
from transformers import TextIteratorStreamer

class Tokenizer:  # what a streamer asks of one
    def decode(self, ids, **kwargs):
        return " ".join(f"t{i}" for i in ids) + " "

streamer = TextIteratorStreamer(Tokenizer(), skip_prompt=True, timeout=120)
outs = []
thread = Thread(target=lambda **kw: outs.append(model.generate(**kw)), kwargs=dict(streamer=streamer,""")
    threaded = threaded.replace("do_sample=False)\nshape = tuple(out.sequences.shape)", """do_sample=False))
thread.start()
text = "".join(streamer)
thread.join()
words = len(text.split())
shape = tuple(outs[0].sequences.shape)""")
    ns: dict = {}
    tr = trace(threaded, ns, mode="fake")
    assert tr.mode == "fake" and ns["shape"] == (1, P + NEW) and ns["words"] == NEW
    same_thread = trace(one, {}, mode="fake")
    assert alloc_stream(tr) == alloc_stream(same_thread)
    assert all(len(_cache_allocs(tr, 1, t)) >= 2 * L for t in range(P, P + NEW))  # the cache, token by token
