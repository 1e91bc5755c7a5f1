"""Unsloth's compiled transformer blocks (its conversational notebook's setup: padded batches
through ``DataCollatorForSeq2Seq``, not packed) under ``xmem estimate``, in a process of its own.

Unsloth compiles each decoder layer as one region, with its 4-bit weights, fused-LoRA
``autograd.Function``s and Triton kernels inside. Two things had made that unlike a GPU run:
Dynamo took xmem's fake ``Params4bit`` for a plain object (a graph break at every ``weight.device``
and Triton launch: ``compiler/fake_parameters.py``), and, once it did not, the compile-time
autograd engine gave the fused-LoRA Functions' gradients to the wrong edges (their SymInt
arguments: ``compiler/python_autograd.py``), so the LoRA weights got no gradient and the
8-bit optimizer no state."""

from __future__ import annotations

import pytest

# skips this module too where Unsloth is not installed
from tests.unsloth_notebook.test_unsloth_qlora import HIDDEN, INTER, LAYERS, SCRIPT as QLORA, estimate_in_child

# the QLoRA notebook's script with the conversational notebook's batches: padded, not packed
SCRIPT = QLORA.replace(
    "from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast",
    "from transformers import AutoModelForCausalLM, DataCollatorForSeq2Seq, LlamaConfig, PreTrainedTokenizerFast",
).replace(
    "trainer = SFTTrainer(model=model, train_dataset=dataset, processing_class=tokenizer,",
    "trainer = SFTTrainer(model=model, train_dataset=dataset, processing_class=tokenizer,\n"
    "    data_collator=DataCollatorForSeq2Seq(tokenizer=tokenizer),",
).replace("per_device_train_batch_size=2,", "per_device_train_batch_size=2, packing=False,")
assert SCRIPT.count("DataCollatorForSeq2Seq") == 2 and "packing=False" in SCRIPT


@pytest.fixture(scope="module")
def estimate(tmp_path_factory) -> dict:
    return estimate_in_child(tmp_path_factory.mktemp("unsloth_blocks"), SCRIPT, "A100-80GB")


def test_unsloths_blocks_compile_without_breaks(estimate):
    notes = "\n".join(estimate["notes"])
    assert "compiled for the target GPU by Inductor" in notes, notes
    assert "graph break" not in notes, notes


def test_the_lora_weights_get_their_8bit_optimizer_state(estimate):
    """The peak is in the second step, after the first optimizer step: the 8-bit AdamW holds a
    state for every LoRA weight, which it makes only for weights that got a gradient (there had
    been none). bitsandbytes' rules: two uint8 states and one float32 absmax per 256 elements
    each (every LoRA weight here has 4,096 elements or more), and two 256-entry float32 code
    books, each allocation rounded up to 512 bytes."""

    def allocated(nbytes: int) -> int:
        return -(-nbytes // 512) * 512

    projections = [(HIDDEN, HIDDEN), (HIDDEN // 2, HIDDEN), (HIDDEN // 2, HIDDEN), (HIDDEN, HIDDEN),
                   (INTER, HIDDEN), (INTER, HIDDEN), (HIDDEN, INTER)]  # q k v o gate up down (out, in)
    lora = [16 * i for o, i in projections] + [o * 16 for o, i in projections]
    assert min(lora) >= 4096
    states = LAYERS * sum(2 * allocated(n) + 2 * allocated(-(-n // 256) * 4) for n in lora) + 2 * allocated(256 * 4)
    assert estimate["breakdown"].get("optimizer_state") == states, estimate["breakdown"]
