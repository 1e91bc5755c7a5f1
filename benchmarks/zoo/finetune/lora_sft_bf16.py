"""LoRA supervised fine-tuning in bf16 with TRL's ``SFTTrainer`` (peft ``LoraConfig`` passed as
``peft_config``, ``optim="adamw_torch"``), the "PEFT Integration" recipe without quantisation.

Pattern: TRL docs, "SFT Trainer" and "PEFT Integration"
(https://huggingface.co/docs/trl/sft_trainer, https://huggingface.co/docs/trl/peft_integration).

Stands for TinyLlama-1.1B (its config, written in code: nothing can be downloaded), made in
bf16 with ``from_config``. The tokenizer is a word-level one built from the dataset's words
(a hub checkpoint would ship its own).
"""
import random
import tempfile

import torch
from datasets import Dataset
from peft import LoraConfig
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

WORDS = ("below is an instruction that describes a task write a response that appropriately completes "
         "the request explain why memory grows with batch size and sequence length").split()
rng = random.Random(0)
dataset = Dataset.from_dict({"text": [" ".join(rng.choice(WORDS) for _ in range(rng.randint(200, 900)))
                                      for _ in range(64)]})

vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "<pad>", *WORDS])}
backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
backend.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                    pad_token="<pad>")

config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                     num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048,
                     bos_token_id=1, eos_token_id=2, pad_token_id=3)
model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)

peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, bias="none", task_type="CAUSAL_LM",
                         target_modules="all-linear")
training_args = SFTConfig(
    output_dir=tempfile.mkdtemp(),
    per_device_train_batch_size=8,
    gradient_checkpointing=False,
    optim="adamw_torch",
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
