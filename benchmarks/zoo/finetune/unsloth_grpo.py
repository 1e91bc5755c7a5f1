"""GRPO with Unsloth, as its reasoning notebooks write it: a 4-bit Llama with LoRA
(``FastLanguageModel.from_pretrained(..., load_in_4bit=True)``, ``get_peft_model`` with r=32 on every
projection and Unsloth's gradient checkpointing), prompts in the chat format with a system prompt
asking for ``<reasoning>``/``<answer>`` tags, three reward functions (the answer's correctness,
an integer answer, the format), and TRL's ``GRPOTrainer`` (which Unsloth patches: its chunked
loss computes each chunk's gradient with ``torch.func.grad_and_value`` under ``torch.compile``)
with ``paged_adamw_8bit``, 6 completions per prompt.

Pattern: Unsloth's "Llama3.1_(8B)-GRPO" Colab notebook, linked from its README and its
reinforcement-learning guide (https://github.com/unslothai/unsloth#-finetune-for-free,
https://docs.unsloth.ai/basics/reinforcement-learning-rl-guide). The notebook generates with
vLLM (``fast_inference=True``); vLLM cannot be installed here, so this generates with the model
itself (``fast_inference=False``), as the notebook does without vLLM.

Stands for Llama-3.2-1B-Instruct (its config, written in code: nothing can be downloaded) and
GSM8K (arithmetic questions made in code), saved with ``save_pretrained`` with a word-level
tokenizer into a temporary folder that ``from_pretrained`` reads as a local checkpoint. Two steps
instead of the notebook's 250. Runs in ``.venv-unsloth`` (``make zoo-unsloth``).
"""
from unsloth import FastLanguageModel  # Unsloth asks to be imported before transformers, trl and peft
from unsloth.chat_templates import get_chat_template

import random
import re
import tempfile

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

NUMBERS = [str(n) for n in range(100)]
WORDS = ("what is plus minus times the answer respond in following format reasoning answer "
         "<reasoning> </reasoning> <answer> </answer> a shop sells apples and pears how many are left").split()
SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
           "<|finetune_right_pad_id|>", "system", "user", "assistant", "Cutting", "Knowledge", "Date:",
           "December", "2023", "Today", "26", "July", "2024", ":"]
vocab = {w: i for i, w in enumerate(dict.fromkeys(["<unk>", *SPECIAL, *WORDS, *NUMBERS]))}
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

max_seq_length = 1024
lora_rank = 32
model, tokenizer = FastLanguageModel.from_pretrained(
    model_name=checkpoint,
    max_seq_length=max_seq_length,
    load_in_4bit=True,
    fast_inference=False,  # the notebook's True needs vLLM
    max_lora_rank=lora_rank,
)
model = FastLanguageModel.get_peft_model(
    model,
    r=lora_rank,
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    lora_alpha=lora_rank,
    use_gradient_checkpointing="unsloth",
    random_state=3407,
)
tokenizer = get_chat_template(tokenizer, chat_template="llama-3.1")

SYSTEM_PROMPT = "respond in the following format : <reasoning> ... </reasoning> <answer> ... </answer>"
rng = random.Random(0)


def question() -> dict:
    a, b = rng.randint(1, 49), rng.randint(1, 49)
    story = " ".join(rng.choice(WORDS[19:]) for _ in range(rng.randint(8, 40)))
    return {"prompt": [{"role": "system", "content": SYSTEM_PROMPT},
                       {"role": "user", "content": f"{story} what is {a} plus {b}"}],
            "answer": str(a + b)}


dataset = Dataset.from_list([question() for _ in range(64)])


def extract_xml_answer(text: str) -> str:
    return text.split("<answer>")[-1].split("</answer>")[0].strip()


def correctness_reward_func(prompts, completions, answer, **kwargs) -> list[float]:
    responses = [completion[0]["content"] for completion in completions]
    return [2.0 if extract_xml_answer(r) == a else 0.0 for r, a in zip(responses, answer)]


def int_reward_func(completions, **kwargs) -> list[float]:
    responses = [completion[0]["content"] for completion in completions]
    return [0.5 if extract_xml_answer(r).isdigit() else 0.0 for r in responses]


def soft_format_reward_func(completions, **kwargs) -> list[float]:
    pattern = r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>"
    responses = [completion[0]["content"] for completion in completions]
    return [0.5 if re.match(pattern, r) else 0.0 for r in responses]


training_args = GRPOConfig(
    learning_rate=5e-6,
    adam_beta1=0.9,
    adam_beta2=0.99,
    weight_decay=0.1,
    warmup_ratio=0.1,
    lr_scheduler_type="cosine",
    optim="paged_adamw_8bit",
    logging_steps=1,
    per_device_train_batch_size=1,
    gradient_accumulation_steps=1,
    num_generations=6,
    max_prompt_length=256,
    max_completion_length=200,
    max_steps=2,
    save_steps=250,
    max_grad_norm=0.1,
    report_to="none",
    output_dir=tempfile.mkdtemp(),
)
trainer = GRPOTrainer(
    model=model,
    processing_class=tokenizer,
    reward_funcs=[soft_format_reward_func, int_reward_func, correctness_reward_func],
    args=training_args,
    train_dataset=dataset,
)
trainer.train()
