"""The contract every linear of a decoder layer keeps, whichever backend holds its weight.

A layer's four products (Attention.wqkv, .wo, FeedForward.w13, .w2) start as model.Linear and may be swapped at load
for packed_linear's PackedLinear or KernelLinear (CPU bf16) or quant's Int8Linear or Int4Linear. The layer and
cpu_ops' fused decode layer call only what LinearProduct names, so a new backend keeps the three methods.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

# codes, scales, mins and (bits, group, n, digits, isa): one product's operands of the kernel op
KernelLayout = tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]


@runtime_checkable
class LinearProduct(Protocol):
    """y = x W^T without bias (Qwen2's Q/K/V bias is added beside the product, by Attention.project)."""

    in_features: int
    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...

    def add_to(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + self(x): the residual stream's add, fused into the product where the backend can."""
        ...

    def kernel_layout(self) -> KernelLayout | None:
        """The engine kernel's operands for this product (the fused decode layer), None where it does not serve it."""
        ...
