"""A GPT-style language model trained with PyTorch Lightning and ``torch.compile``: the same
``LightningModule`` as ``lightning_bf16.py``, passed to ``Trainer.fit`` compiled
(``torch.compile(LitGPT())``), ``precision="bf16-mixed"``. Lightning takes the compiled module
apart (``from_compiled``) and compiles ``training_step`` with its Dynamo context.

Pattern: Lightning docs, "Speed up models by compiling them"
(https://lightning.ai/docs/pytorch/stable/advanced/compile.html): ``model = torch.compile(model)``
then ``trainer.fit(model)``.

Stands for GPT-2 small (124M; its config, written in code: nothing can be downloaded), batch 16 x 1024.
"""
import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset
from transformers import GPT2Config, GPT2LMHeadModel


class RandomTokens(Dataset):
    def __init__(self, n=64, block=1024, vocab=50257):
        self.data = torch.randint(0, vocab, (n, block), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i]


class LitGPT(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = GPT2LMHeadModel(GPT2Config(n_embd=768, n_layer=12, n_head=12, n_positions=1024))

    def training_step(self, batch, batch_idx):
        loss = self.model(input_ids=batch, labels=batch).loss
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=6e-4, weight_decay=0.1)


trainer = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=2, logger=False,
                    enable_checkpointing=False)
model = torch.compile(LitGPT())
trainer.fit(model, DataLoader(RandomTokens(), batch_size=16, shuffle=True))
