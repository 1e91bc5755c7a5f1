"""Direct Preference Optimization with TRL's ``DPOTrainer``: a policy being trained and a frozen
reference model (an explicit ``ref_model``, a copy of the SFT checkpoint), a tiny preference
dataset of prompt / chosen / rejected strings, bf16, AdamW.

Pattern: TRL docs, "DPO Trainer" quick start (https://huggingface.co/docs/trl/dpo_trainer):
``DPOConfig`` + ``DPOTrainer(model=..., ref_model=..., args=..., train_dataset=...,
processing_class=tokenizer)``.

Stands for a Qwen2.5-0.5B-Instruct-sized policy (its config, written in code: nothing can be
downloaded). The SFT checkpoint is the config's model saved with ``save_pretrained`` into a
temporary folder; policy and reference are both loaded from it. The tokenizer is a word-level
one built from the dataset's words.
"""
import random
import tempfile

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config
from trl import DPOConfig, DPOTrainer

WORDS = ("what is the capital of france paris is a city in europe i do not know please tell me "
         "more about gradient checkpointing it trades compute for memory by recomputing activations").split()
rng = random.Random(0)


def sentence(lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


train_dataset = Dataset.from_dict({
    "prompt": [sentence(64, 256) for _ in range(32)],
    "chosen": [sentence(128, 384) for _ in range(32)],
    "rejected": [sentence(128, 384) for _ in range(32)],
})

vocab = {w: i for i, w in enumerate(["<unk>", "<|im_start|>", "<|endoftext|>", "<pad>", *dict.fromkeys(WORDS)])}
backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
backend.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<|im_start|>",
                                    eos_token="<|endoftext|>", pad_token="<pad>")

config = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                     num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                     tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=3)
sft_checkpoint = tempfile.mkdtemp()
AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(sft_checkpoint)

model = AutoModelForCausalLM.from_pretrained(sft_checkpoint, dtype=torch.bfloat16)
ref_model = AutoModelForCausalLM.from_pretrained(sft_checkpoint, dtype=torch.bfloat16)

training_args = DPOConfig(
    output_dir=tempfile.mkdtemp(),
    beta=0.1,
    per_device_train_batch_size=4,
    gradient_checkpointing=True,
    learning_rate=5e-7,
    bf16=True,
    max_length=1024,
    max_steps=2,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
)
trainer = DPOTrainer(model=model, ref_model=ref_model, args=training_args, train_dataset=train_dataset,
                     processing_class=tokenizer)
trainer.train()
