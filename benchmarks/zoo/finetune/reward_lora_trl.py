"""A reward model for RLHF with TRL's ``RewardTrainer``: a sequence-classification head (one
score) on a causal LM, trained with LoRA on chosen / rejected pairs; bf16.

Pattern: TRL docs, "Reward Modeling" (https://huggingface.co/docs/trl/reward_trainer):
``AutoModelForSequenceClassification.from_pretrained(..., num_labels=1)``, ``RewardConfig``,
``RewardTrainer(model=..., args=..., processing_class=tokenizer, train_dataset=...,
peft_config=LoraConfig(task_type="SEQ_CLS", ...))``.

Stands for a Qwen2.5-0.5B-sized reward model (its config, written in code: nothing can be
downloaded), saved with ``save_pretrained`` into a temporary folder and loaded from it. The
tokenizer is a word-level one built from the dataset's words.
"""
import random
import tempfile

import torch
from datasets import Dataset
from peft import LoraConfig
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForSequenceClassification, PreTrainedTokenizerFast, Qwen2Config
from trl import RewardConfig, RewardTrainer

WORDS = ("what is the capital of france paris is a city in europe i do not know please tell me "
         "more about gradient checkpointing it trades compute for memory by recomputing activations").split()
rng = random.Random(0)


def sentence(lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


train_dataset = Dataset.from_dict({"chosen": [sentence(64, 256) for _ in range(64)],
                                   "rejected": [sentence(64, 256) for _ in range(64)]})

vocab = {w: i for i, w in enumerate(["<unk>", "<|im_start|>", "<|endoftext|>", "<pad>", *dict.fromkeys(WORDS)])}
backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
backend.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<|im_start|>",
                                    eos_token="<|endoftext|>", pad_token="<pad>")

config = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                     num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                     tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=3, num_labels=1)
checkpoint = tempfile.mkdtemp()
AutoModelForSequenceClassification.from_config(config, dtype=torch.bfloat16).save_pretrained(checkpoint)
model = AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=1, dtype=torch.bfloat16)

training_args = RewardConfig(
    output_dir=tempfile.mkdtemp(),
    per_device_train_batch_size=8,
    bf16=True,
    max_length=512,
    max_steps=2,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
)
trainer = RewardTrainer(model=model, args=training_args, processing_class=tokenizer, train_dataset=train_dataset,
                        peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, task_type="SEQ_CLS"))
trainer.train()
