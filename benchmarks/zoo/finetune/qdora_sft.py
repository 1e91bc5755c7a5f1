"""QDoRA: DoRA adapters (weight-decomposed LoRA, peft ``use_dora=True``) on a 4-bit NF4 base
model, trained with TRL's ``SFTTrainer``: the QLoRA recipe (``BitsAndBytesConfig`` with double
quantisation and bf16 compute, ``device_map={"": 0}``, ``paged_adamw_8bit``, gradient
checkpointing) with DoRA's magnitude vectors; each forward dequantizes every adapted 4-bit
weight to take its norm.

Pattern: peft docs, "LoRA" developer guide, "Weight-Decomposed Low-Rank Adaptation (DoRA)"
(https://huggingface.co/docs/peft/developer_guides/lora#weight-decomposed-low-rank-adaptation-dora),
which supports DoRA on bitsandbytes-quantized layers ("QDoRA"), with TRL's QLoRA setup
(https://huggingface.co/docs/trl/peft_integration).

Stands for Llama-3.2-1B (its config, written in code: nothing can be downloaded), saved locally
with ``save_pretrained`` and loaded the documented way, as ``qlora_sft.py`` does.
"""
import random
import tempfile

import torch
from datasets import Dataset
from peft import LoraConfig
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

WORDS = ("the model learns to follow instructions and answer questions about memory kernels "
         "gradients optimizers tokens batches layers adapters quantization paged states").split()
rng = random.Random(0)
texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(300, 1200))) for _ in range(64)]
dataset = Dataset.from_dict({"text": texts})

vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "<pad>", *WORDS])}
backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
backend.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                    pad_token="<pad>")

# The user's local checkpoint: Llama-3.2-1B's shape, saved in bf16.
config = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
                     tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=3)
checkpoint = tempfile.mkdtemp()
AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(checkpoint)
tokenizer.save_pretrained(checkpoint)

bnb_config = BitsAndBytesConfig(
    load_in_4bit=True,
    bnb_4bit_quant_type="nf4",
    bnb_4bit_use_double_quant=True,
    bnb_4bit_compute_dtype=torch.bfloat16,
)
model = AutoModelForCausalLM.from_pretrained(checkpoint, quantization_config=bnb_config, device_map={"": 0},
                                             dtype=torch.bfloat16)

peft_config = LoraConfig(
    r=16,
    lora_alpha=32,
    lora_dropout=0.05,
    bias="none",
    task_type="CAUSAL_LM",
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    use_dora=True,
)
training_args = SFTConfig(
    output_dir=tempfile.mkdtemp(),
    per_device_train_batch_size=4,
    gradient_accumulation_steps=1,
    gradient_checkpointing=True,
    optim="paged_adamw_8bit",
    learning_rate=2e-4,
    bf16=True,
    max_length=1024,
    max_steps=2,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
)
trainer = SFTTrainer(model=model, args=training_args, train_dataset=dataset, processing_class=tokenizer,
                     peft_config=peft_config)
trainer.train()
