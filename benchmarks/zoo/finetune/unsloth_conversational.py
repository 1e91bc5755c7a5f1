"""Unsloth's conversational fine-tuning notebook, whole: a 4-bit Llama-3.2 with LoRA, the Llama-3.1
chat template, ``standardize_sharegpt``, TRL's ``SFTTrainer`` with ``DataCollatorForSeq2Seq``
(padded batches, not packed), ``train_on_responses_only``, then ``FastLanguageModel.for_inference``
and ``generate()`` (64 new tokens, sampling), and the adapter saved with ``save_pretrained``.

Pattern: Unsloth's "Llama3.2_(1B_and_3B)-Conversational" Colab notebook, linked from its README
(https://github.com/unslothai/unsloth#-finetune-for-free, https://docs.unsloth.ai/get-started/unsloth-notebooks).

Stands for Llama-3.2-1B-Instruct (its config, written in code: nothing can be downloaded) and
FineTome-100k (ShareGPT-style conversations made in code), saved with ``save_pretrained`` with a
word-level tokenizer into a temporary folder that ``from_pretrained`` reads as a local checkpoint.
Two steps instead of the notebook's 60. Runs in ``.venv-unsloth`` (``make zoo-unsloth``).
"""
from unsloth import FastLanguageModel  # Unsloth asks to be imported before transformers, trl and peft
from unsloth.chat_templates import get_chat_template, standardize_sharegpt, train_on_responses_only

import random
import tempfile

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, DataCollatorForSeq2Seq, LlamaConfig, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

WORDS = ("the model learns to follow instructions and answer questions about memory kernels "
         "gradients optimizers tokens batches layers adapters quantization paged states").split()
SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
           "<|finetune_right_pad_id|>", "system", "user", "assistant", "Cutting", "Knowledge", "Date:",
           "December", "2023", "Today", "26", "July", "2024", ":"]
vocab = {w: i for i, w in enumerate(["<unk>", *SPECIAL, *WORDS])}
backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<|begin_of_text|>",
                                    eos_token="<|eot_id|>", pad_token="<|finetune_right_pad_id|>")
config = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
                     tie_word_embeddings=True, bos_token_id=1, eos_token_id=4, pad_token_id=5)
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
    use_rslora=False,
    loftq_config=None,
)
tokenizer = get_chat_template(tokenizer, chat_template="llama-3.1")

rng = random.Random(0)


def turn(n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


dataset = Dataset.from_dict({"conversations": [[{"from": "human", "value": turn(rng.randint(20, 200))},
                                                {"from": "gpt", "value": turn(rng.randint(100, 900))}]
                                               for _ in range(64)]})
dataset = standardize_sharegpt(dataset)


def formatting_prompts_func(examples):
    convos = examples["conversations"]
    texts = [tokenizer.apply_chat_template(convo, tokenize=False, add_generation_prompt=False) for convo in convos]
    return {"text": texts}


dataset = dataset.map(formatting_prompts_func, batched=True)

trainer = SFTTrainer(
    model=model,
    tokenizer=tokenizer,
    train_dataset=dataset,
    dataset_text_field="text",
    max_seq_length=max_seq_length,
    data_collator=DataCollatorForSeq2Seq(tokenizer=tokenizer),
    dataset_num_proc=1,
    packing=False,
    args=SFTConfig(
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
trainer = train_on_responses_only(trainer, instruction_part="<|start_header_id|>user<|end_header_id|>\n\n",
                                  response_part="<|start_header_id|>assistant<|end_header_id|>\n\n")
trainer_stats = trainer.train()

FastLanguageModel.for_inference(model)
messages = [{"role": "user", "content": "the model learns to answer questions about memory"}]
inputs = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                       return_tensors="pt").to("cuda")
outputs = model.generate(input_ids=inputs, max_new_tokens=64, use_cache=True, temperature=1.5, min_p=0.1)
print(tokenizer.batch_decode(outputs)[0][:200])

saved = tempfile.mkdtemp()
model.save_pretrained(saved)  # the LoRA adapter, as the notebook saves it ("lora_model")
tokenizer.save_pretrained(saved)
