"""nn.Transformer encoder-decoder for translation (the PyTorch tutorial's model): token
embeddings with positional encoding, causal and padding masks, label-smoothed CE."""
import math

import torch
import torch.nn as nn

SRC_VOCAB, TGT_VOCAB, PAD = 10000, 10000, 1


class PositionalEncoding(nn.Module):
    def __init__(self, emb, dropout=0.1, maxlen=5000):
        super().__init__()
        den = torch.exp(-torch.arange(0, emb, 2) * math.log(10000) / emb)
        pos = torch.arange(0, maxlen).reshape(maxlen, 1)
        pe = torch.zeros((maxlen, emb))
        pe[:, 0::2] = torch.sin(pos * den)
        pe[:, 1::2] = torch.cos(pos * den)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", pe.unsqueeze(-2))

    def forward(self, x):
        return self.dropout(x + self.pe[:x.size(0), :])


class Seq2SeqTransformer(nn.Module):
    def __init__(self, emb=512, heads=8, layers=6):
        super().__init__()
        self.transformer = nn.Transformer(d_model=emb, nhead=heads, num_encoder_layers=layers,
                                          num_decoder_layers=layers, dim_feedforward=2048, dropout=0.1)
        self.generator = nn.Linear(emb, TGT_VOCAB)
        self.src_emb, self.tgt_emb = nn.Embedding(SRC_VOCAB, emb), nn.Embedding(TGT_VOCAB, emb)
        self.pos = PositionalEncoding(emb)
        self.scale = math.sqrt(emb)

    def forward(self, src, tgt, src_mask, tgt_mask, src_pad, tgt_pad):
        out = self.transformer(self.pos(self.src_emb(src) * self.scale), self.pos(self.tgt_emb(tgt) * self.scale),
                               src_mask, tgt_mask, None, src_pad, tgt_pad, src_pad)
        return self.generator(out)


DEVICE = torch.device("cuda")
model = Seq2SeqTransformer().to(DEVICE)
for p in model.parameters():
    if p.dim() > 1:
        nn.init.xavier_uniform_(p)
loss_fn = nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=0.1)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
for step in range(3):
    src = torch.randint(2, SRC_VOCAB, (60, 64)).to(DEVICE)
    tgt = torch.randint(2, TGT_VOCAB, (50, 64)).to(DEVICE)
    src[-5:, :8] = PAD
    tgt_input = tgt[:-1, :]
    tgt_mask = nn.Transformer.generate_square_subsequent_mask(tgt_input.size(0), device=DEVICE).bool()
    src_mask = torch.zeros((src.size(0), src.size(0)), device=DEVICE).type(torch.bool)
    logits = model(src, tgt_input, src_mask, tgt_mask, (src == PAD).transpose(0, 1), (tgt_input == PAD).transpose(0, 1))
    optimizer.zero_grad()
    loss = loss_fn(logits.reshape(-1, logits.shape[-1]), tgt[1:, :].reshape(-1))
    loss.backward()
    optimizer.step()
