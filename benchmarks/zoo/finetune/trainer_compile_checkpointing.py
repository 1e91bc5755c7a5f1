"""Causal-LM fine-tuning with the Hugging Face ``Trainer`` and its documented speed and memory
flags: ``bf16=True`` (accelerate's autocast around the forward), ``torch_compile=True``
(accelerate compiles the model with Inductor) and ``gradient_checkpointing=True``, fused AdamW.

Pattern: transformers docs, "Trainer" and "GPU memory and speed" / "Methods and tools for
efficient training on a single GPU" (https://huggingface.co/docs/transformers/trainer,
https://huggingface.co/docs/transformers/perf_train_gpu_one): the flags as ``TrainingArguments``.

Stands for GPT-2 (124M: its config, written in code: nothing can be downloaded), batch 8 x 1024.
The tokenizer is a word-level one built from the dataset's words (a hub checkpoint would ship its own).
"""
import random
import tempfile

from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (AutoModelForCausalLM, DataCollatorForLanguageModeling, GPT2Config, PreTrainedTokenizerFast,
                          Trainer, TrainingArguments)

WORDS = ("the model learns to follow instructions and answer questions about memory kernels "
         "gradients optimizers tokens batches layers checkpoints compilers").split()
rng = random.Random(0)
texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(900, 1400))) for _ in range(64)]

vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "<pad>", *WORDS])}
backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
backend.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                    pad_token="<pad>")
dataset = Dataset.from_dict({"text": texts}).map(
    lambda batch: tokenizer(batch["text"], truncation=True, max_length=1024), batched=True, remove_columns=["text"])

config = GPT2Config(n_embd=768, n_layer=12, n_head=12, n_positions=1024, vocab_size=50257,
                    bos_token_id=1, eos_token_id=2, pad_token_id=3)
model = AutoModelForCausalLM.from_config(config)

args = TrainingArguments(
    output_dir=tempfile.mkdtemp(),
    per_device_train_batch_size=8,
    max_steps=2,
    learning_rate=5e-5,
    bf16=True,
    torch_compile=True,
    gradient_checkpointing=True,
    optim="adamw_torch_fused",
    logging_steps=1,
    save_strategy="no",
    report_to="none",
)
trainer = Trainer(model=model, args=args, train_dataset=dataset,
                  data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
trainer.train()
