"""Kahneman-Tversky Optimization with TRL's ``KTOTrainer``: unpaired feedback (a prompt, one
completion, and whether it was desirable), the policy and, implicitly, a frozen reference copy
of it; bf16, AdamW.

Pattern: TRL docs, "KTO Trainer" quick start (https://huggingface.co/docs/trl/kto_trainer):
``KTOConfig`` + ``KTOTrainer(model=..., args=..., processing_class=tokenizer,
train_dataset=...)`` on a dataset of ``prompt`` / ``completion`` / ``label``.

Stands for a Qwen2.5-0.5B-Instruct-sized policy (its config, written in code: nothing can be
downloaded), saved with ``save_pretrained`` into a temporary folder and loaded from it. The
tokenizer is a word-level one built from the dataset's words. Its 32 rows are fewer than
``--max-batch`` would try: above 32 each step gets all of them, and the search says the batch
no longer changes the memory.
"""
import random
import tempfile

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config
from trl import KTOConfig, KTOTrainer

WORDS = ("what is the capital of france paris is a city in europe i do not know please tell me "
         "more about gradient checkpointing it trades compute for memory by recomputing activations").split()
rng = random.Random(0)


def sentence(lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


train_dataset = Dataset.from_dict({
    "prompt": [sentence(32, 128) for _ in range(32)],
    "completion": [sentence(64, 256) for _ in range(32)],
    "label": [i % 3 != 0 for i in range(32)],  # two desirable completions for each undesirable one
})

vocab = {w: i for i, w in enumerate(["<unk>", "<|im_start|>", "<|endoftext|>", "<pad>", *dict.fromkeys(WORDS)])}
backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
backend.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<|im_start|>",
                                    eos_token="<|endoftext|>", pad_token="<pad>")

config = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                     num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                     tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=3)
checkpoint = tempfile.mkdtemp()
AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(checkpoint)
model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16)

training_args = KTOConfig(
    output_dir=tempfile.mkdtemp(),
    per_device_train_batch_size=4,
    learning_rate=5e-7,
    bf16=True,
    max_length=512,
    max_steps=2,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
)
trainer = KTOTrainer(model=model, args=training_args, processing_class=tokenizer, train_dataset=train_dataset)
trainer.train()
