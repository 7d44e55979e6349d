"""Weight-only quantization (W8A16, W4A16): packed weights and the products that use them.

Weights are stored packed (the bytes really shrink) and never dequantized to full size on CPU. On an x86
CPU the products run in the engine's own kernel (engine/qkernel.py, csrc/qmm*.cpp: AVX2 or AVX-512 VNNI,
activations quantized per block of 32 inside the product as llama.cpp does); without it, and on CUDA,
PyTorch's own packed kernels (int4) or dequantized weights (int8 on CUDA) serve, so nothing requires the
kernel. Both grids are the GGUF's: Int4Grid holds Q4_1 codes exactly, Int8Grid Q8_0's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specledger.engine import qkernel
from specledger.engine.cpu_ops import resolve
from specledger.engine.linear import KernelLayout
from specledger.engine.model import direct_call
from specledger.errors import BadInput

QUANTS = ("none", "int8", "int4")
# bits of an activation inside the kernel's products: 16 (two int8 digits, ~15 bits: the default) or 8 (one digit,
# as llama.cpp's Q4/Q8 products quantize them: half the integer work of a many-row product, e.g. a prefill)
ACTIVATIONS = (16, 8)
BLOCK = 32  # the int8 grid's block and the kernel's activation block (GGUF's QK)


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


@dataclass
class Int8Grid:
    """Block-wise symmetric codes: w = q * scale per block of 32 inputs, q in [-127, 127] (GGUF Q8_0)."""

    codes: torch.Tensor  # int8 [N, K]
    scale: torch.Tensor  # [N, K // 32], values representable in fp16

    def rows(self, ids: torch.Tensor) -> Int8Grid:
        return Int8Grid(self.codes.index_select(0, ids), self.scale.index_select(0, ids))

    def dequantize(self) -> torch.Tensor:
        n, k = self.codes.shape
        return (self.codes.float().reshape(n, k // BLOCK, BLOCK) * self.scale.float()[..., None]).reshape(n, k)


def int4_grid(w: torch.Tensor, group_size: int) -> Int4Grid:
    n, k = w.shape
    g = w.float().reshape(n, k // group_size, group_size)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-8)
    q = ((g - lo[..., None]) / scale[..., None]).round().clamp(0, 15).reshape(n, k)
    return Int4Grid(q.to(torch.uint8), scale, lo + 8 * scale, group_size)


def int8_grid(w: torch.Tensor) -> Int8Grid:
    """Q8_0's quantization: scale = amax / 127 per block, rounded to fp16 first so the codes fit the stored scale."""
    n, k = w.shape
    b = w.float().reshape(n, k // BLOCK, BLOCK)
    scale = (b.abs().amax(-1) / 127).half().float()
    q = (b / scale.clamp(min=1e-30)[..., None]).round().clamp(-127, 127)
    return Int8Grid(q.reshape(n, k).to(torch.int8), scale)


def check_group_size(in_features: int, group_size: int, name: str = "weight") -> None:
    if group_size not in (32, 64, 128, 256):
        raise BadInput(f"group size {group_size} is not supported (use 32, 64, 128 or 256)")
    if in_features % group_size:
        ok = [g for g in (32, 64, 128, 256) if in_features % g == 0]
        raise BadInput(
            f"group size {group_size} does not divide the input width {in_features} of {name}; "
            f"valid group sizes here: {', '.join(map(str, ok)) or 'none'}"
        )


# --- the kernel's layout (csrc/qmm_common.h's header says why) ----------------------------------------


def _tiles(t: torch.Tensor) -> torch.Tensor:
    """[N, ...] -> [N/16, 16, ...], the rows padded with zeros to a multiple of 16."""
    pad = -t.shape[0] % 16
    if pad:
        t = torch.cat([t, t.new_zeros(pad, *t.shape[1:])])
    return t.reshape(-1, 16, *t.shape[1:])


def _tiled_groups(t: torch.Tensor) -> torch.Tensor:
    """Per-group values [N, G] -> fp16 [N/16, G, 16]: one load gives a group's value for 16 weight rows."""
    return _tiles(t.float()).transpose(1, 2).half().contiguous()


def pack_int4(grid: Int4Grid) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes in the kernel's tiles, two per byte, with fp16 scales d and mins m = zero - 8 d (w = d u + m)."""
    n, k = grid.codes.shape
    c = _tiles(grid.codes.to(torch.uint8).reshape(n, k // 32, 4, 2, 4))  # [T, row, block, chunk, nibble, input]
    c = c.permute(0, 2, 3, 4, 1, 5).reshape(-1, k // 32, 4, 2, 64)  # [T, block, chunk, nibble, row * 4 + input]
    packed = (c[:, :, :, 0] | (c[:, :, :, 1] << 4)).reshape(-1, k // 32, 256).contiguous()
    mins = grid.zero.float() - 8 * grid.scale.float()
    return packed, _tiled_groups(grid.scale), _tiled_groups(mins)


def pack_int8(grid: Int8Grid) -> tuple[torch.Tensor, torch.Tensor]:
    n, k = grid.codes.shape
    c = _tiles(grid.codes.reshape(n, k // 32, 8, 4)).permute(0, 2, 3, 1, 4)  # [T, block, step, row, input]
    return c.reshape(-1, k // 32, 512).contiguous(), _tiled_groups(grid.scale)


def unpack_int8(codes: torch.Tensor, scales: torch.Tensor, n: int) -> Int8Grid:
    """The grid back from the kernel's tiles (pack_int8 inverted)."""
    t, nb, _ = codes.shape
    c = codes.reshape(t, nb, 8, 16, 4).permute(0, 3, 1, 2, 4).reshape(t * 16, nb * 32)
    return Int8Grid(c[:n].contiguous(), scales.transpose(1, 2).reshape(t * 16, nb)[:n].float())


def _fits_fp16(*ts: torch.Tensor) -> bool:
    return all(bool(t.float().abs().max() < 65504) for t in ts)


class _Quantized(nn.Module):
    """What the two quantized linears share: the engine's kernel on their codes where it serves (`_op`, chosen once,
    when built: cpu_ops.resolve), else each one's PyTorch backend (`_torch`)."""

    weight: torch.Tensor  # buffers (the backend's layout)
    scales: torch.Tensor
    mins: torch.Tensor
    bits: int
    group_size: int
    out_features: int
    in_features: int

    def _use_kernel(self, device: torch.device, fits: bool) -> bool:
        """The kernel serves where it is loaded for `device`, the inputs come in blocks of 32 and the scales fit."""
        self.isa, self.digits = qkernel.requested_isa(), 2
        self._op = resolve(device).qmm if fits and self.in_features % BLOCK == 0 else None
        self.backend = "kernel" if self._op is not None else "torch"
        return self._op is not None

    def _keep(self, weight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> None:
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)
        self.register_buffer("mins", mins)

    def _torch(self, x2: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _product(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        if self._op is None:
            return self._torch(x2)
        return self._op(x2.contiguous(), self.weight, self.scales, self.mins, self.bits, self.group_size,
                        self.out_features, self.digits, self.isa, residual)

    def kernel_layout(self) -> KernelLayout | None:
        """The kernel's operands for this product (cpu_ops' fused layer), None where the kernel does not serve it."""
        if self._op is None:
            return None
        return self.weight, self.scales, self.mins, [self.bits, self.group_size, self.out_features, self.digits,
                                                     self.isa]

    def add_to(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + self(x), the residual stream's add fused into the product where the kernel serves it."""
        if self._op is None or residual.dtype != torch.float32 or not residual.is_contiguous():
            return residual + self(x)
        return self._product(x, residual).view(residual.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._product(x).reshape(*x.shape[:-1], self.out_features)


def use_activation_bits(model: nn.Module, bits: int) -> None:
    """Every kernel product of `model` quantizes its activations to `bits` (ACTIVATIONS). Int8 is a precision of the
    kernel's: where PyTorch's kernels serve (CUDA, no kernel built) it is refused rather than silently not applied."""
    if bits not in ACTIVATIONS:
        raise BadInput(f"activations must be 16 or 8 bits (got {bits})")
    served = [m for m in model.modules() if isinstance(m, _Quantized) and m._op is not None]
    if bits == 8 and not served:
        raise BadInput("int8 activations need quantized weights (int4/int8) served by the engine's CPU kernel "
                       f"({qkernel.describe()})")
    for m in served:
        m.digits = 1 if bits == 8 else 2


@direct_call
class Int8Linear(_Quantized):
    """Int8 weights, w = q * scale per block of 32 inputs (GGUF Q8_0; per output channel where the width is not
    a multiple of 32). Backends: the engine's kernel (CPU), PyTorch's per-channel int8 kernel (CPU without it:
    the block codes re-quantized per channel), dequantized weights (CUDA)."""

    bits, group_size = 8, BLOCK

    def __init__(self, weight: torch.Tensor | Int8Grid, act_dtype: torch.dtype, device: torch.device | None = None):
        super().__init__()
        grid = weight if isinstance(weight, Int8Grid) else None
        t = weight.codes if isinstance(weight, Int8Grid) else weight
        dev = torch.device(device) if device is not None else t.device
        self.out_features, self.in_features = int(t.shape[0]), int(t.shape[1])
        self.act_dtype = act_dtype
        if grid is None and self.in_features % BLOCK == 0:
            grid = int8_grid(t)
        if self._use_kernel(dev, grid is not None and _fits_fp16(grid.scale)) and grid is not None:
            codes, scales = pack_int8(grid)
            self._keep(codes.to(dev), scales.to(dev), torch.empty(0, dtype=torch.float16, device=dev))
            return
        w = grid.dequantize() if grid is not None else t.float()
        if dev.type == "cuda":
            self.register_buffer("weight", w.to(device=dev, dtype=act_dtype))
            self.backend = "dense"
            return
        scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-8)
        self.register_buffer("weight", (w / scale[:, None]).round().clamp(-128, 127).to(torch.int8).to(dev))
        self.register_buffer("scales", scale.to(device=dev, dtype=act_dtype))

    def select_rows(self, ids: torch.Tensor) -> Int8Linear:
        """The product for a subset of output rows (a restricted LM head), on the same codes and scales."""
        ids = ids.to(self.weight.device)
        if self.backend == "kernel":
            return Int8Linear(unpack_int8(self.weight, self.scales, self.out_features).rows(ids), self.act_dtype,
                              self.weight.device)
        rows = self.weight.index_select(0, ids)
        if self.backend == "torch":
            rows = rows.float() * self.scales.index_select(0, ids).float()[:, None]
        return Int8Linear(rows.float(), self.act_dtype, self.weight.device)

    def _torch(self, x2: torch.Tensor) -> torch.Tensor:
        if self.backend == "dense":
            return F.linear(x2, self.weight)
        return torch.ops.aten._weight_int8pack_mm.default(x2, self.weight, self.scales)


@direct_call
class Int4Linear(_Quantized):
    """Group-wise asymmetric int4 weights: the engine's kernel on CPU, else PyTorch's packed int4 kernels."""

    bits = 4
    scales_and_zeros: torch.Tensor

    def __init__(self, grid: Int4Grid, act_dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.out_features, self.in_features = grid.codes.shape
        self.group_size = grid.group_size
        device = torch.device(device)
        if self._use_kernel(device, _fits_fp16(grid.scale, grid.zero)):
            self._keep(*pack_int4(grid))
            return
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

    def _torch(self, x2: torch.Tensor) -> torch.Tensor:
        return self._mm(x2, self.weight, self.group_size, self.scales_and_zeros)
