"""bert-tiny: a BERT encoder with 2 layers, hidden 128, 2 heads, intermediate 512
(post-LN, exact GELU), a pooler (dense + tanh on token 0) and a classification head
(dropout, Linear), as BERT's sequence classifier.

Input: int64 token ids (batch, seq_len), seq_len <= max_position; every token has token
type 0 and there is no attention mask. Dropout (p=0.1) is present as in BERT; the
compiler runs the model in eval mode, where it is the identity.

Parameter names::

    word_embeddings.weight, position_embeddings.weight, token_type_embeddings.weight
    embedding_norm.{weight,bias}
    layers.<i>.attention.{query,key,value,out}.{weight,bias}
    layers.<i>.attention_norm.{weight,bias}
    layers.<i>.ffn.0.{weight,bias}  (hidden -> intermediate), layers.<i>.ffn.2.*  (back)
    layers.<i>.ffn_norm.{weight,bias}
    pooler.{weight,bias}, classifier.{weight,bias}

Buffers `position_ids` and `token_type_ids` are not persistent (not in the state dict).
"""
from __future__ import annotations

import torch
from torch import nn

VOCAB_SIZE, MAX_POSITION, TYPE_VOCAB_SIZE = 30522, 512, 2  # BERT's uncased WordPiece vocabulary
HIDDEN, LAYERS, HEADS, INTERMEDIATE = 128, 2, 2, 512
HEAD_DIM = HIDDEN // HEADS
LAYER_NORM_EPS, DROPOUT = 1e-12, 0.1


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention over all tokens."""

    def __init__(self):
        super().__init__()
        self.query = nn.Linear(HIDDEN, HIDDEN)
        self.key = nn.Linear(HIDDEN, HIDDEN)
        self.value = nn.Linear(HIDDEN, HIDDEN)
        self.out = nn.Linear(HIDDEN, HIDDEN)
        self.dropout = nn.Dropout(DROPOUT)

    @staticmethod
    def _split_heads(x: torch.Tensor) -> torch.Tensor:
        """(B, T, HIDDEN) -> (B, HEADS, T, HEAD_DIM)."""
        return x.reshape(x.shape[0], x.shape[1], HEADS, HEAD_DIM).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (self._split_heads(proj(x)) for proj in (self.query, self.key, self.value))
        scores = torch.matmul(q, k.transpose(-1, -2)) / HEAD_DIM ** 0.5
        context = torch.matmul(self.dropout(torch.softmax(scores, dim=-1)), v)
        return self.out(context.transpose(1, 2).reshape(x.shape))


class EncoderLayer(nn.Module):
    """Post-LN transformer layer: x = LN(x + attn(x)); x = LN(x + ffn(x))."""

    def __init__(self):
        super().__init__()
        self.attention = SelfAttention()
        self.attention_norm = nn.LayerNorm(HIDDEN, eps=LAYER_NORM_EPS)
        self.ffn = nn.Sequential(nn.Linear(HIDDEN, INTERMEDIATE), nn.GELU(), nn.Linear(INTERMEDIATE, HIDDEN))
        self.ffn_norm = nn.LayerNorm(HIDDEN, eps=LAYER_NORM_EPS)
        self.dropout = nn.Dropout(DROPOUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attention_norm(x + self.dropout(self.attention(x)))
        return self.ffn_norm(x + self.dropout(self.ffn(x)))


class BertTiny(nn.Module):
    def __init__(self, num_classes: int = 10, vocab_size: int = VOCAB_SIZE, max_position: int = MAX_POSITION):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, HIDDEN)
        self.position_embeddings = nn.Embedding(max_position, HIDDEN)
        self.token_type_embeddings = nn.Embedding(TYPE_VOCAB_SIZE, HIDDEN)
        self.register_buffer("position_ids", torch.arange(max_position), persistent=False)
        self.register_buffer("token_type_ids", torch.zeros(max_position, dtype=torch.long), persistent=False)
        self.embedding_norm = nn.LayerNorm(HIDDEN, eps=LAYER_NORM_EPS)
        self.dropout = nn.Dropout(DROPOUT)
        self.layers = nn.Sequential(*[EncoderLayer() for _ in range(LAYERS)])
        self.pooler = nn.Linear(HIDDEN, HIDDEN)
        self.classifier = nn.Linear(HIDDEN, num_classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        seq_len = ids.shape[1]
        h = (self.word_embeddings(ids) + self.position_embeddings(self.position_ids[:seq_len])
             + self.token_type_embeddings(self.token_type_ids[:seq_len]))
        h = self.layers(self.dropout(self.embedding_norm(h)))
        return self.classifier(self.dropout(torch.tanh(self.pooler(h[:, 0]))))
