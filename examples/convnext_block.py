"""A correct ConvNeXt-style stage: a channels-first LayerNorm on NCHW and a channels-last nn.LayerNorm after
a permute. Both normalise the channel axis only, so normaudit reports the sites and no finding.

    normaudit examples/convnext_block.py
"""
import torch
import torch.nn.functional as F
from torch import nn


class ChannelsFirstLayerNorm(nn.Module):
    def __init__(self, channels: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x):  # (N, C, H, W): statistics over C at each pixel
        mean = x.mean(1, keepdim=True)
        var = (x - mean).pow(2).mean(1, keepdim=True)
        x = (x - mean) / torch.sqrt(var + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)  # NCHW -> NHWC
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(y))))
        return x + y.permute(0, 3, 1, 2)


class Stage(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 32, kernel_size=4, stride=4)
        self.stem_norm = ChannelsFirstLayerNorm(32)
        self.blocks = nn.Sequential(Block(32), Block(32))

    def forward(self, img):
        return self.blocks(self.stem_norm(self.stem(img)))


def build_model():
    return Stage()
