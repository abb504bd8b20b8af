"""A small pre-LN language model with three silent normalisation bugs normaudit finds:

1. the hand-written RMSNorm reduces over (sequence, hidden), so later tokens leak into earlier ones;
2. the blocks' norms ignore the configured eps (config says 1e-5, modules keep 1e-6);
3. the last block reaches the LM head without a final norm.

    normaudit examples/buggy_lm.py
"""
import torch
from torch import nn

CONFIG = {"vocab_size": 128, "hidden_size": 32, "num_hidden_layers": 2, "rms_norm_eps": 1e-5}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):  # x: (batch, seq, hidden)
        ms = x.float().pow(2).mean(dim=(1, 2), keepdim=True)  # bug 1: should be mean(-1)
        return self.weight * (x.float() * torch.rsqrt(ms + self.eps)).type_as(x)


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.attn_norm = RMSNorm(d)  # bug 2: eps=CONFIG["rms_norm_eps"] was meant
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.mlp_norm = RMSNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.attn_norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.mlp_norm(x))


class TinyLM(nn.Module):
    def __init__(self, cfg=CONFIG):
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(Block(cfg["hidden_size"]) for _ in range(cfg["num_hidden_layers"]))
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)  # bug 3: no final norm

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(x)


def build_model():
    return TinyLM()


def example_inputs():
    return (torch.randint(0, 128, (2, 16)),)
