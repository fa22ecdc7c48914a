"""A small vision transformer, the model that tensor parallelism splits (notebook 11, ``--model vit_*``).

An image is cut into square patches, each patch projected to a token of ``dim`` numbers and given a
learned position; ``depth`` blocks of attention and MLP, each behind a LayerNorm with a residual
connection, mix the tokens; the head averages them and classifies. There is no class token: the
sequence stays a whole number of patches (64 at 32 px with 4 px patches, 196 at 224 px with 16 px
patches), which sequence parallelism splits evenly over 2 or 4 ranks.

The attention keeps its query, key and value projections as three ``nn.Linear`` layers, and reads
its number of heads from the width it is given: split column-wise over N ranks, each rank's
projections hold 1/N of the heads, and the same code computes them (Megatron-LM's layout).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ViTShape:
    """The sizes of one vision transformer."""

    dim: int  # numbers per token
    depth: int  # blocks
    heads: int  # attention heads in each block
    mlp_ratio: int = 4  # the MLP's hidden width is dim * mlp_ratio

    @property
    def head_dim(self) -> int:
        """Numbers per token in one head: the heads split ``dim`` between them."""
        return self.dim // self.heads


VIT_SHAPES = {
    "vit_tiny": ViTShape(dim=64, depth=2, heads=4),  # about 0.1 M parameters: seconds on a CPU
    "vit_small": ViTShape(dim=384, depth=12, heads=8),  # about 21 M: ViT-S/16's size at 224 px
}


def patch_size(image_size: int) -> int:
    """4 px patches on 32 px CIFAR images (an 8x8 grid), 16 px at 224 px (14x14, ViT/16's)."""
    return 4 if image_size < 64 else 16


class PatchEmbedding(nn.Module):
    """Patches to tokens: a convolution with stride = kernel = patch size, plus a learned position each."""

    def __init__(self, image_size: int, dim: int) -> None:
        super().__init__()
        size = patch_size(image_size)
        self.project = nn.Conv2d(3, dim, kernel_size=size, stride=size)
        self.position = nn.Parameter(torch.zeros(1, (image_size // size) ** 2, dim))
        nn.init.trunc_normal_(self.position, std=0.02)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        # (batch, tokens, dim), contiguous: sent whole from one pipeline stage to the next
        return (self.project(images).flatten(2).transpose(1, 2) + self.position).contiguous()


class Attention(nn.Module):
    """Multi-head self-attention. Its heads come from the width of ``query``'s output, so a column-wise
    split of the three projections gives each rank whole heads, and ``out`` (split row-wise) sums them."""

    def __init__(self, dim: int, head_dim: int) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.query, self.key, self.value = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        batch, length, _ = tokens.shape

        def heads(projection: nn.Linear) -> torch.Tensor:  # (batch, heads here, tokens, head_dim)
            return projection(tokens).view(batch, length, -1, self.head_dim).transpose(1, 2)

        mixed = nn.functional.scaled_dot_product_attention(heads(self.query), heads(self.key), heads(self.value))
        return self.out(mixed.transpose(1, 2).reshape(batch, length, -1))


class MLP(nn.Module):
    """Two linear layers with a GELU between: ``up`` widens each token, ``down`` narrows it back."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up, self.act, self.down = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(tokens)))


class Block(nn.Module):
    """One transformer block: attention and MLP, each behind a LayerNorm, each added to its input."""

    def __init__(self, shape: ViTShape) -> None:
        super().__init__()
        self.attention_norm, self.attention = nn.LayerNorm(shape.dim), Attention(shape.dim, shape.head_dim)
        self.mlp_norm, self.mlp = nn.LayerNorm(shape.dim), MLP(shape.dim, shape.dim * shape.mlp_ratio)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        tokens = tokens + self.attention(self.attention_norm(tokens))
        return tokens + self.mlp(self.mlp_norm(tokens))


class Head(nn.Module):
    """The last LayerNorm, the mean over all tokens, and the linear classifier."""

    def __init__(self, dim: int, num_classes: int) -> None:
        super().__init__()
        self.norm, self.classify = nn.LayerNorm(dim), nn.Linear(dim, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.classify(self.norm(tokens).mean(dim=1))


class VisionTransformer(nn.Module):
    """Patch embedding, ``shape.depth`` blocks, head."""

    def __init__(self, shape: ViTShape, num_classes: int = 100, image_size: int = 32) -> None:
        super().__init__()
        self.shape = shape
        self.embed = PatchEmbedding(image_size, shape.dim)
        self.blocks = nn.Sequential(*(Block(shape) for _ in range(shape.depth)))
        self.head = Head(shape.dim, num_classes)

    @property
    def tokens(self) -> int:
        return self.embed.position.shape[1]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(images)))


def build_vit(name: str, num_classes: int = 100, image_size: int = 32) -> VisionTransformer:
    """The vision transformer called ``name`` (a key of :data:`VIT_SHAPES`) for ``image_size`` px images."""
    return VisionTransformer(VIT_SHAPES[name], num_classes, image_size)
