"""bf16 products on weights that oneDNN laid out once, at load, instead of on every call.

On a CPU with bf16 arithmetic (AVX-512 BF16, AMX) `F.linear` on a bf16 weight hands it to oneDNN, which
reorders the whole matrix into its blocked layout before every product: for one decode row that reorder
is most of the cost. Reordering once at load (`mkldnn._reorder_linear_weight`) and calling the
pointwise-linear op on the result halves a SmolLM2 layer's products at 1-16 rows and cuts the LM head
by ~40% (benchmarks/packed_linear.py). Where oneDNN cannot pack bf16 (an AVX2-only host raises), PyTorch's
own bf16 product is slower still (4x the fp32 one for a row, 6x more for 8 rows): the products take the
engine's kernel (csrc/bf16mm.cpp) on the weights as they are. A model that is not a CPU bf16 one, or a host
with neither, keeps plain `Linear`s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specledger.engine.cpu_ops import resolve
from specledger.engine.model import Linear, direct_call

PACK_ROWS = 8  # the batch-size hint oneDNN picks its blocking for (a decode batch or a short chain)


@direct_call
class PackedLinear(nn.Module):
    """A bias-free bf16 Linear whose weight is held only in oneDNN's layout (an opaque `_mkldnn` tensor)."""

    packed: torch.Tensor

    def __init__(self, packed: torch.Tensor) -> None:
        super().__init__()
        self.out_features, self.in_features = packed.shape
        self.register_buffer("packed", packed)

    @property
    def weight(self) -> torch.Tensor:
        """A dense copy, for the rare reader of the matrix itself (the EAGLE head's LM-head rows)."""
        return self.packed.to_dense()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the packed op has no backward (autograd would pass through it silently wrong), nor other dtypes
        if x.dtype != torch.bfloat16 or (torch.is_grad_enabled() and x.requires_grad):
            return F.linear(x, self.weight.to(x.dtype))
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")

    def add_to(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return residual + self(x)

    def kernel_layout(self) -> None:
        """None: oneDNN's product, not the engine kernel's."""
        return None


@direct_call
class KernelLinear(Linear):
    """A bias-free CPU bf16 Linear whose products run on the engine's kernel; the weight is the original
    Parameter (a tied LM head keeps sharing the embedding's storage)."""

    def __init__(self, weight: nn.Parameter) -> None:
        super().__init__(weight.shape[1], weight.shape[0], bias=False, device="meta")
        self.weight = weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16 or x.device.type != "cpu" or (torch.is_grad_enabled() and x.requires_grad):
            return F.linear(x, self.weight)  # the kernel has no backward
        y = torch.ops.specledger.bf16mm(x.reshape(-1, self.in_features).contiguous(), self.weight.detach())
        return y.view(*x.shape[:-1], self.out_features)


def pack(linear: nn.Linear) -> PackedLinear | KernelLinear | None:
    """The packed twin of a bias-free CPU bf16 Linear (oneDNN's, else the engine kernel's); None where neither
    serves on this host."""
    w = linear.weight
    if linear.bias is not None or w.dtype != torch.bfloat16 or w.device.type != "cpu":
        return None
    if torch.backends.mkldnn.is_available():
        try:
            return PackedLinear(torch.ops.mkldnn._reorder_linear_weight(w.detach().contiguous(), PACK_ROWS))
        except RuntimeError:  # "bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq"
            pass
    if resolve(w.device).qmm is None or linear.in_features % 16 or not w.is_contiguous():
        return None
    return KernelLinear(linear.weight)


def pack_linears(model: nn.Module) -> int:
    """Replace every packable `Linear` of the model by its packed twin; how many were replaced."""
    done = 0
    for owner in list(model.modules()):
        for name, child in list(owner.named_children()):
            if type(child) is Linear and (p := pack(child)) is not None:
                setattr(owner, name, p)
                done += 1
    return done
