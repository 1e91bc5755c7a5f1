"""A Trainer or an Accelerator made in an earlier notebook cell, used in a traced one: it was
made for this machine's device and holds accelerate's state of this process, which each trace
replaces with a new process's (``patches.fresh_singletons``). The trace stopped inside
accelerate ("`PartialState` object has no attribute `process_index`. This happens if
`PartialState._reset_state()` was called..."); it says what to do now, and the user's state is
as it was."""

from __future__ import annotations

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("transformers")

from xmem_engine.tracing import trace  # noqa: E402
from xmem_engine.tracing.errors import TracerError  # noqa: E402

EARLIER_CELL = """
import tempfile
from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainingArguments
model = AutoModelForCausalLM.from_config(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=256))
rows = [{"input_ids": [5] * 32, "labels": [5] * 32}] * 16
args = TrainingArguments(tempfile.mkdtemp(), per_device_train_batch_size=4, max_steps=2, report_to=[], save_strategy="no")
trainer = Trainer(model=model, args=args, train_dataset=rows)
"""


def test_a_trainer_from_an_earlier_cell_gets_a_clear_error_and_keeps_its_state():
    ns: dict = {}
    exec(EARLIER_CELL, ns)
    with pytest.raises(TracerError, match=r"at <cell>:1 was made before it .* Make it inside the traced code"):
        trace("trainer.train()", ns, mode="fake")
    assert ns["args"].process_index == 0 and str(ns["args"].device) == "cpu"  # the user's own, untouched


def test_the_same_trainer_made_in_the_traced_code_trains_on_the_virtual_gpu():
    tr = trace(EARLIER_CELL + "trainer.train()\n", {}, mode="fake")
    assert sum(e.bytes for e in tr.events if e.kind == "alloc" and e.category == "gradient") > 0
