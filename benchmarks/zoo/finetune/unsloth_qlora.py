"""QLoRA with Unsloth, as its README and Colab notebooks write it: ``FastLanguageModel.from_pretrained(
..., load_in_4bit=True)``, ``FastLanguageModel.get_peft_model`` (LoRA r=16 on every projection,
``use_gradient_checkpointing="unsloth"``: activations offloaded to the host), TRL's ``SFTTrainer``
with ``optim="adamw_8bit"``. Unsloth patches the model with its own Triton kernels (RoPE,
RMSNorm, cross-entropy, LoRA MLP).

Pattern: Unsloth README "Quickstart" / the Llama-3.2 (1B and 3B) conversational notebook
(https://github.com/unslothai/unsloth#-quickstart, https://docs.unsloth.ai/get-started/fine-tuning-llms-guide).

Stands for Llama-3.2-1B (its config, written in code: nothing can be downloaded), saved with
``save_pretrained`` with its tokenizer into a temporary folder that ``from_pretrained`` reads as a
local checkpoint. Unsloth is not in ``.venv-ft`` (it pins transformers <= 5.17 and trl <= 1.15),
so the zoo lists this script as skipped there.
"""
from unsloth import FastLanguageModel  # Unsloth asks to be imported before transformers, trl and peft

import random
import tempfile

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

WORDS = ("the model learns to follow instructions and answer questions about memory kernels "
         "gradients optimizers tokens batches layers adapters quantization paged states").split()
rng = random.Random(0)
dataset = Dataset.from_dict({"text": [" ".join(rng.choice(WORDS) for _ in range(rng.randint(300, 1200)))
                                      for _ in range(64)]})

vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "<pad>", *WORDS])}
backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
backend.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                    pad_token="<pad>")
config = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
                     tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=3)
checkpoint = tempfile.mkdtemp()
AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(checkpoint)
tokenizer.save_pretrained(checkpoint)

max_seq_length = 2048
model, tokenizer = FastLanguageModel.from_pretrained(model_name=checkpoint, max_seq_length=max_seq_length,
                                                     dtype=None, load_in_4bit=True)
model = FastLanguageModel.get_peft_model(
    model,
    r=16,
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    lora_alpha=16,
    lora_dropout=0,
    bias="none",
    use_gradient_checkpointing="unsloth",
    random_state=3407,
    max_seq_length=max_seq_length,
)
trainer = SFTTrainer(
    model=model,
    train_dataset=dataset,
    processing_class=tokenizer,
    args=SFTConfig(
        dataset_text_field="text",
        max_length=max_seq_length,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        warmup_steps=1,
        max_steps=2,
        learning_rate=2e-4,
        logging_steps=1,
        optim="adamw_8bit",
        weight_decay=0.01,
        lr_scheduler_type="linear",
        seed=3407,
        output_dir=tempfile.mkdtemp(),
        report_to="none",
    ),
)
trainer.train()
