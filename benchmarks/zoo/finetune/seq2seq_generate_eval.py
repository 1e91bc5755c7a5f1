"""Summarization fine-tuning with ``Seq2SeqTrainer``: T5 trained in fp16 and evaluated with
``predict_with_generate`` (the evaluation generates up to 64 tokens per document and a
``compute_metrics`` decodes them), as the summarization notebooks do.

Pattern: Hugging Face docs, "Summarization" task guide
(https://huggingface.co/docs/transformers/tasks/summarization): a ``preprocess_function``
tokenizing ``"summarize: " + document`` and ``text_target=summary``,
``DataCollatorForSeq2Seq``, ``Seq2SeqTrainingArguments(predict_with_generate=True, fp16=True,
eval_strategy=...)``, a ``compute_metrics`` over the decoded predictions (a word-overlap
score here: the ``evaluate`` library's ROUGE needs a download).

Stands for t5-base (its shape, written in code: nothing can be downloaded), with a word-level
tokenizer built from the dataset's words.
"""
import random
import tempfile

import numpy as np
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (DataCollatorForSeq2Seq, PreTrainedTokenizerFast, Seq2SeqTrainer, Seq2SeqTrainingArguments,
                          T5Config, T5ForConditionalGeneration)

WORDS = ("what is the capital of france paris is a city in europe i do not know please tell me "
         "more about gradient checkpointing it trades compute for memory by recomputing activations").split()
rng = random.Random(0)


def sentence(lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


vocab = {w: i for i, w in enumerate(["<pad>", "</s>", "<unk>", "summarize:", *dict.fromkeys(WORDS)])}
backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
backend.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>", pad_token="<pad>")

raw = Dataset.from_dict({"document": [sentence(200, 500) for _ in range(64)],
                         "summary": [sentence(20, 60) for _ in range(64)]})


def preprocess_function(examples):
    model_inputs = tokenizer(["summarize: " + doc for doc in examples["document"]], max_length=512, truncation=True)
    model_inputs["labels"] = tokenizer(text_target=examples["summary"], max_length=128, truncation=True)["input_ids"]
    return model_inputs


tokenized = raw.map(preprocess_function, batched=True, remove_columns=raw.column_names)

config = T5Config(vocab_size=32128, d_model=768, d_ff=3072, num_layers=12, num_heads=12, decoder_start_token_id=0,
                  pad_token_id=0, eos_token_id=1)
model = T5ForConditionalGeneration(config)


def compute_metrics(eval_pred):
    predictions, labels = eval_pred
    predictions = np.where(predictions != -100, predictions, tokenizer.pad_token_id)
    decoded_preds = tokenizer.batch_decode(predictions, skip_special_tokens=True)
    labels = np.where(labels != -100, labels, tokenizer.pad_token_id)
    decoded_labels = tokenizer.batch_decode(labels, skip_special_tokens=True)
    overlap = [len(set(p.split()) & set(r.split())) / max(1, len(set(r.split())))
               for p, r in zip(decoded_preds, decoded_labels)]
    gen_len = [np.count_nonzero(p != tokenizer.pad_token_id) for p in predictions]
    return {"overlap": round(float(np.mean(overlap)), 4), "gen_len": round(float(np.mean(gen_len)), 2)}


training_args = Seq2SeqTrainingArguments(
    output_dir=tempfile.mkdtemp(),
    eval_strategy="steps",
    eval_steps=2,
    learning_rate=2e-5,
    per_device_train_batch_size=8,
    per_device_eval_batch_size=8,
    weight_decay=0.01,
    max_steps=2,
    predict_with_generate=True,
    generation_max_length=64,
    fp16=True,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
)
trainer = Seq2SeqTrainer(model=model, args=training_args, train_dataset=tokenized,
                         eval_dataset=tokenized.select(range(16)), processing_class=tokenizer,
                         data_collator=DataCollatorForSeq2Seq(tokenizer=tokenizer, model=model),
                         compute_metrics=compute_metrics)
trainer.train()
