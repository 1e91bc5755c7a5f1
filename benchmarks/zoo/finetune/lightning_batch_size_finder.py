"""Lightning's batch size finder before training: ``Tuner(trainer).scale_batch_size(model,
mode="power")`` doubles the module's ``batch_size`` from 2 until a trial of 3 steps runs out of
memory, keeps the last size that ran, then ``trainer.fit`` trains at it. A GPT-style model in
``bf16-mixed``, AdamW.

Pattern: Lightning docs, "Effective Training Techniques", "Batch Size Finder"
(https://lightning.ai/docs/pytorch/stable/advanced/training_tricks.html#batch-size-finder): the
module holds ``self.batch_size`` and its ``train_dataloader`` reads it; ``Tuner(trainer)``,
``tuner.scale_batch_size(model, mode="power")``.

Stands for GPT-2 medium (355M; its config, written in code: nothing can be downloaded), blocks of 1024 tokens.
"""
import lightning as L
import torch
from lightning.pytorch.tuner import Tuner
from torch.utils.data import DataLoader, Dataset
from transformers import GPT2Config, GPT2LMHeadModel


class RandomTokens(Dataset):
    def __init__(self, n=4096, block=1024, vocab=50257):
        self.data = torch.randint(0, vocab, (n, block), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i]


class LitGPT(L.LightningModule):
    def __init__(self, batch_size=2):
        super().__init__()
        self.batch_size = batch_size
        self.model = GPT2LMHeadModel(GPT2Config(n_embd=1024, n_layer=24, n_head=16, n_positions=1024))

    def training_step(self, batch, batch_idx):
        return self.model(input_ids=batch, labels=batch).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-4, weight_decay=0.1)

    def train_dataloader(self):
        return DataLoader(RandomTokens(), batch_size=self.batch_size, shuffle=True)


model = LitGPT()
trainer = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=2, logger=False,
                    enable_checkpointing=False)
tuner = Tuner(trainer)
tuner.scale_batch_size(model, mode="power")
print("batch size found:", model.batch_size)
trainer.fit(model)
