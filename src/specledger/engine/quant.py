"""Weight-only quantization (W8A16, W4A16) with PyTorch's packed-int kernels.

Weights are stored packed (the bytes really shrink) and multiplied by the fused kernels;
nothing is dequantized to full size at load or per call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from specledger.engine.model import direct_call
from specledger.errors import BadInput

QUANTS = ("none", "int8", "int4")


@dataclass
class Int4Grid:
    """Group-wise asymmetric codes: w = (q - 8) * scale + zero, q in [0, 15].

    A GGUF Q4_1 tensor (w = d * q + m, groups of 32) maps onto this grid exactly:
    scale = d, zero = m + 8 d, so re-quantization loses nothing but the scale's rounding.
    """

    codes: torch.Tensor  # uint8/int32 [N, K]
    scale: torch.Tensor  # [N, K // g]
    zero: torch.Tensor  # [N, K // g]
    group_size: int


def int4_grid(w: torch.Tensor, group_size: int) -> Int4Grid:
    n, k = w.shape
    g = w.float().reshape(n, k // group_size, group_size)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-8)
    q = ((g - lo[..., None]) / scale[..., None]).round().clamp(0, 15).reshape(n, k)
    return Int4Grid(q.to(torch.uint8), scale, lo + 8 * scale, group_size)


def check_group_size(in_features: int, group_size: int, name: str = "weight") -> None:
    if group_size not in (32, 64, 128, 256):
        raise BadInput(f"group size {group_size} is not supported (use 32, 64, 128 or 256)")
    if in_features % group_size:
        ok = [g for g in (32, 64, 128, 256) if in_features % g == 0]
        raise BadInput(
            f"group size {group_size} does not divide the input width {in_features} of {name}; "
            f"valid group sizes here: {', '.join(map(str, ok)) or 'none'}"
        )


@direct_call
class Int8Linear(nn.Module):
    """Per-output-channel symmetric int8 weights."""

    def __init__(self, weight: torch.Tensor, act_dtype: torch.dtype) -> None:
        super().__init__()
        w = weight.float()
        scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-8)
        q = (w / scale[:, None]).round().clamp(-128, 127).to(torch.int8)
        self.out_features, self.in_features = w.shape
        self.register_buffer("weight", q)
        self.register_buffer("scales", scale.to(act_dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = torch.ops.aten._weight_int8pack_mm.default(x.reshape(-1, shape[-1]), self.weight, self.scales)
        return y.reshape(*shape[:-1], self.out_features)


@direct_call
class Int4Linear(nn.Module):
    """Group-wise asymmetric int4 weights in the packed layout of the int4 matmul kernels."""

    def __init__(self, grid: Int4Grid, act_dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.out_features, self.in_features = grid.codes.shape
        self.group_size = grid.group_size
        codes = grid.codes.to(device)
        # The packed layout is device-specific, so the kernel is chosen here, once (an OpOverload
        # called directly also skips the packet's overload resolution on every call).
        if device.type == "cpu":
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
            self._mm = torch.ops.aten._weight_int4pack_mm_for_cpu.default
        else:  # CUDA tinygemm: two codes per byte, high nibble first
            self._mm = torch.ops.aten._weight_int4pack_mm.default
            c = codes.to(torch.uint8)
            packed = torch.ops.aten._convert_weight_to_int4pack((c[:, ::2] << 4 | c[:, 1::2]).contiguous(), 2)
        sz = torch.stack([grid.scale, grid.zero], dim=-1).transpose(0, 1).contiguous()  # [K/g, N, 2]
        self.register_buffer("weight", packed)
        self.register_buffer("scales_and_zeros", sz.to(device=device, dtype=act_dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = self._mm(x.reshape(-1, shape[-1]), self.weight, self.group_size, self.scales_and_zeros)
        return y.reshape(*shape[:-1], self.out_features)
