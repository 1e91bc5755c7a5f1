"""Fine-tune a BERT-base-sized classifier with transformers' Trainer for 3 steps (the
run_glue recipe; the config is written in code as nothing can be downloaded)."""
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class RandomGlue(Dataset):
    def __init__(self, n=256, seq_len=128, vocab=30522):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, vocab, (n, seq_len), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.labels[i]}


config = BertConfig(num_labels=2)  # bert-base-uncased's shape
model = BertForSequenceClassification(config)
args = TrainingArguments(
    output_dir=tempfile.mkdtemp(),
    per_device_train_batch_size=32,
    learning_rate=2e-5,
    max_steps=3,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
)
trainer = Trainer(model=model, args=args, train_dataset=RandomGlue())
trainer.train()
