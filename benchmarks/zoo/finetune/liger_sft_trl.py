"""Liger Kernel switched on through TRL: ``SFTConfig(use_liger_kernel=True)`` makes ``SFTTrainer``
patch the model with Liger's Triton kernels (fused linear cross-entropy, RMSNorm, RoPE, SwiGLU),
full fine-tuning in bf16 with AdamW and gradient checkpointing.

Pattern: TRL docs, "Liger Kernel Integration" (https://huggingface.co/docs/trl/liger_kernel_integration):
``training_args = SFTConfig(..., use_liger_kernel=True)``.

Stands for Qwen2.5-0.5B (its config, written in code: nothing can be downloaded), whose 151936-token
vocabulary makes the logits Liger avoids large. The tokenizer is a word-level one built from the
dataset's words.
"""
import random
import tempfile

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config
from trl import SFTConfig, SFTTrainer

WORDS = ("user asks how to reduce memory assistant says use a smaller batch gradient checkpointing "
         "fused kernels or a paged optimizer and measure before guessing").split()
rng = random.Random(0)
dataset = Dataset.from_dict({"text": [" ".join(rng.choice(WORDS) for _ in range(rng.randint(400, 1500)))
                                      for _ in range(64)]})

vocab = {w: i for i, w in enumerate(["<unk>", "<|im_start|>", "<|endoftext|>", "<pad>", *dict.fromkeys(WORDS)])}
backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
backend.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<|im_start|>",
                                    eos_token="<|endoftext|>", pad_token="<pad>")

config = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                     num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                     tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=3)
model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)

training_args = SFTConfig(
    output_dir=tempfile.mkdtemp(),
    use_liger_kernel=True,
    per_device_train_batch_size=8,
    gradient_checkpointing=True,
    learning_rate=2e-5,
    bf16=True,
    max_length=2048,
    max_steps=2,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
)
trainer = SFTTrainer(model=model, args=training_args, train_dataset=dataset, processing_class=tokenizer)
trainer.train()
