"""A BiLSTM part-of-speech tagger (2 layers, batch_first) over padded, packed sentences,
the classic PyTorch tutorial model at a realistic size."""
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

VOCAB, TAGS, EMB, HIDDEN = 20000, 45, 300, 512


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, EMB, padding_idx=0)
        self.lstm = nn.LSTM(EMB, HIDDEN, num_layers=2, batch_first=True, bidirectional=True, dropout=0.3)
        self.out = nn.Linear(2 * HIDDEN, TAGS)

    def forward(self, words, lengths):
        packed = pack_padded_sequence(self.embed(words), lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True)
        return self.out(out)


model = Tagger().cuda()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(3):
    lengths = torch.randint(10, 60, (64,))
    words = torch.zeros(64, int(lengths.max()), dtype=torch.long)
    for i, n in enumerate(lengths):
        words[i, :n] = torch.randint(1, VOCAB, (int(n),))
    tags = torch.randint(0, TAGS, words.shape)
    tags[words == 0] = -100
    words, tags = words.cuda(), tags.cuda()
    logits = model(words, lengths)
    loss = nn.functional.cross_entropy(logits.reshape(-1, TAGS), tags[:, :logits.size(1)].reshape(-1), ignore_index=-100)
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 5.0)
    optimizer.step()
