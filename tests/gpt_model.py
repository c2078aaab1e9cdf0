"""A small GPT-shaped model for the profiler tests: token embedding, a
``layers`` ModuleList of 4 transformer blocks, an output head; input token
ids of shape (batch, sequence)."""

from __future__ import annotations

import torch
from torch import nn

VOCAB, WIDTH, HEADS, BLOCKS = 512, 64, 4, 4


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(WIDTH, HEADS, dim_feedforward=4 * WIDTH, dropout=0.0, batch_first=True)
            for _ in range(BLOCKS))
        self.head = nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB))

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def make_gpt() -> TinyGPT:
    """A fresh model (seeded weights)."""
    state = torch.random.get_rng_state()
    torch.manual_seed(7)
    try:
        return TinyGPT()
    finally:
        torch.random.set_rng_state(state)
