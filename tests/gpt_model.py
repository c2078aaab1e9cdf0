"""A small GPT-shaped model for the profiler tests: token embedding, a
``layers`` ModuleList of 4 transformer blocks, an output head; input token
ids of shape (batch, sequence)."""

from __future__ import annotations

import torch
from torch import nn

VOCAB, WIDTH, HEADS, BLOCKS = 512, 64, 4, 4

BENCH = {"vocab": 8192, "width": 256, "heads": 4, "blocks": 4}
"""The benchmark's size (benchmarks/gpt_cpu.py): a head of 256 x 8192 weighs
about as much as two blocks, so the even 3,3 split is not the best."""


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = VOCAB, width: int = WIDTH, heads: int = HEADS, blocks: int = BLOCKS):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, dim_feedforward=4 * width, dropout=0.0, batch_first=True)
            for _ in range(blocks))
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, vocab))

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def make_gpt(**sizes) -> TinyGPT:
    """A fresh model (seeded weights); ``sizes``: vocab, width, heads, blocks."""
    state = torch.random.get_rng_state()
    torch.manual_seed(7)
    try:
        return TinyGPT(**sizes)
    finally:
        torch.random.set_rng_state(state)


def make_bench_gpt() -> TinyGPT:
    """The benchmark's GPT (:data:`BENCH`)."""
    return make_gpt(**BENCH)
