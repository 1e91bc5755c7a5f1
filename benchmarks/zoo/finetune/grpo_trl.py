"""Group Relative Policy Optimization with TRL's ``GRPOTrainer``, generating with the policy itself
(``use_vllm=False``, the default: no generation server), a reward function written in Python
(reward longer completions up to a length), 4 completions per prompt.

Pattern: TRL docs, "GRPO Trainer" quick start (https://huggingface.co/docs/trl/grpo_trainer):
``GRPOTrainer(model=..., reward_funcs=reward_len, args=GRPOConfig(...), train_dataset=...)``
with a prompt-only dataset.

Stands for Qwen2-0.5B-Instruct (its config, written in code: nothing can be downloaded), saved
with ``save_pretrained`` into a temporary folder and loaded from there, as the quick start
passes a checkpoint name. The tokenizer is a word-level one built from the prompts' words.
"""
import random
import tempfile

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config
from trl import GRPOConfig, GRPOTrainer

WORDS = ("summarize the following post in one sentence my cat sleeps all day and the dog barks at night "
         "we moved to a new flat near the river last spring").split()
rng = random.Random(0)
dataset = Dataset.from_dict({"prompt": [" ".join(rng.choice(WORDS) for _ in range(rng.randint(32, 128)))
                                        for _ in range(32)]})

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
tokenizer.save_pretrained(checkpoint)


def reward_len(completions, **kwargs):
    """The quick start's toy reward: completions close to 20 words score best."""
    return [-abs(20 - len(c.split())) for c in completions]


training_args = GRPOConfig(
    output_dir=tempfile.mkdtemp(),
    use_vllm=False,
    num_generations=4,
    per_device_train_batch_size=8,
    max_completion_length=128,
    gradient_checkpointing=True,
    learning_rate=1e-6,
    bf16=True,
    max_steps=2,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
)
trainer = GRPOTrainer(model=checkpoint, reward_funcs=reward_len, args=training_args, train_dataset=dataset,
                      processing_class=tokenizer)
trainer.train()
