"""bert-tiny: a 2-layer, 128-wide BERT-style encoder (post-LN, GELU, 2 heads) with a
pooler (dense + tanh on token 0) and a classification head."""
from __future__ import annotations

import torch
from torch import nn

VOCAB, MAX_POSITIONS, TYPE_VOCAB = 30522, 512, 2  # BERT's uncased WordPiece vocabulary
HIDDEN, LAYERS, HEADS, INTERMEDIATE = 128, 2, 2, 512
LN_EPS, DROPOUT = 1e-12, 0.1


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
        self.out = nn.Linear(HIDDEN, HIDDEN)
        self.drop = nn.Dropout(DROPOUT)

    def _heads(self, x):
        b, t, _ = x.shape
        return x.view(b, t, HEADS, HIDDEN // HEADS).transpose(1, 2)  # (B, H, T, D)

    def forward(self, x):
        q, k, v = self._heads(self.query(x)), self._heads(self.key(x)), self._heads(self.value(x))
        att = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / (HIDDEN // HEADS) ** 0.5, dim=-1)
        ctx = torch.matmul(self.drop(att), v).transpose(1, 2).reshape(x.shape)
        return self.out(ctx)


class EncoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = SelfAttention()
        self.ln1 = nn.LayerNorm(HIDDEN, eps=LN_EPS)
        self.ffn = nn.Sequential(nn.Linear(HIDDEN, INTERMEDIATE), nn.GELU(), nn.Linear(INTERMEDIATE, HIDDEN))
        self.ln2 = nn.LayerNorm(HIDDEN, eps=LN_EPS)
        self.drop = nn.Dropout(DROPOUT)

    def forward(self, x):
        x = self.ln1(x + self.drop(self.attention(x)))
        return self.ln2(x + self.drop(self.ffn(x)))


class BertTiny(nn.Module):
    def __init__(self, num_classes: int = 10, vocab_size: int = VOCAB):
        super().__init__()
        self.word = nn.Embedding(vocab_size, HIDDEN)
        self.position = nn.Embedding(MAX_POSITIONS, HIDDEN)
        self.token_type = nn.Embedding(TYPE_VOCAB, HIDDEN)
        self.register_buffer("position_ids", torch.arange(MAX_POSITIONS), persistent=False)
        self.ln = nn.LayerNorm(HIDDEN, eps=LN_EPS)
        self.drop = nn.Dropout(DROPOUT)
        self.layers = nn.Sequential(*[EncoderLayer() for _ in range(LAYERS)])
        self.pooler = nn.Linear(HIDDEN, HIDDEN)
        self.classifier = nn.Linear(HIDDEN, num_classes)

    def forward(self, ids):
        pos = self.position(self.position_ids[: ids.shape[1]])
        h = self.drop(self.ln(self.word(ids) + pos + self.token_type.weight[0]))
        h = self.layers(h)
        return self.classifier(torch.tanh(self.pooler(h[:, 0])))
