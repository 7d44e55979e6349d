"""engine/roofline.py: its byte counts are the bytes loading really holds, and its MACs the products really run."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from specledger.engine import qkernel
from specledger.engine.loader import load_model, weight_bytes
from specledger.engine.roofline import (Precision, decode_bytes, kv_bytes_per_position, model_bytes,
                                        prefill_macs, product_macs_per_token)
from tests.conftest import tiny_model
from tests.engine.test_qwen import save_qwen

pytestmark = pytest.mark.usefixtures("one_thread")

DENSE = [Precision("fp32"), Precision("bf16")]
QUANTIZED = [Precision("bf16", "int8"), Precision("bf16", "int4"), Precision("bf16", "int4", 64),
             Precision("fp32", "int4", 32, 8)]
needs_kernel = pytest.mark.skipif(qkernel.op() is None, reason="the kernel's layout is what model_bytes counts")


@pytest.mark.parametrize("p", DENSE + [pytest.param(p, marks=needs_kernel) for p in QUANTIZED], ids=str)
def test_model_bytes_are_what_loading_holds(p):
    lm = tiny_model(dtype=p.dtype, quant=p.quant, group_size=p.group_size, vocab=100, hidden=128)
    assert model_bytes(lm.config, p).resident == lm.weight_bytes


@needs_kernel
@pytest.mark.parametrize("kind,p", [("qwen2", Precision("bf16", "int4")), ("qwen2", Precision("bf16")),
                                    ("qwen3", Precision("bf16", "int8")), ("qwen3", Precision("fp32"))], ids=str)
def test_model_bytes_with_biases_head_norms_and_an_untied_head(tmp_path, kind, p):
    lm = load_model(str(save_qwen(tmp_path / kind, kind)), with_tokenizer=False, dtype=p.dtype, quant=p.quant)
    assert model_bytes(lm.config, p).resident == weight_bytes(lm.model)


def test_decode_bytes_read_the_head_once_and_one_embedding_row():
    lm = tiny_model(vocab=100, hidden=128)
    mb = model_bytes(lm.config, Precision("fp32"))
    assert mb.head == 0  # tied at fp32: the embedding is the head
    assert decode_bytes(lm.config, Precision("fp32"), 0, 4) == mb.layers + mb.embedding + mb.vectors + 128 * 4
    cache = lm.model.new_cache(10)
    per_position = sum(t.numel() * t.element_size() for t in (cache.k, cache.v)) // cache.k.shape[-2]
    assert kv_bytes_per_position(lm.config, cache.k.element_size()) == per_position
    assert decode_bytes(lm.config, Precision("fp32"), 7, 4) - decode_bytes(lm.config, Precision("fp32"), 0, 4) == \
        7 * per_position


def test_product_macs_are_the_products_a_step_runs():
    """FlopCounterMode counts every matrix product of one forward of the dense model: a one-token step's products
    are the layers' (product_macs_per_token) and the LM head, two flops a MAC."""
    lm = tiny_model(vocab=100, hidden=128)
    cfg = lm.config
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        lm.model.hidden(torch.tensor([[3]]), lm.model.new_cache(4))
    mm = sum(v for op, v in fc.get_flop_counts()["Global"].items() if "mm" in str(op) or "linear" in str(op))
    assert mm == 2 * product_macs_per_token(cfg)
    attention = cfg.n_layers * 2 * cfg.n_heads * cfg.head_dim
    assert prefill_macs(cfg, 1) == product_macs_per_token(cfg) + attention + cfg.vocab_size * cfg.hidden_size
    # n tokens: token i attends to i + 1 positions (causal), plus `start` cached ones each
    assert prefill_macs(cfg, 3, start=5) - 3 * product_macs_per_token(cfg) - cfg.vocab_size * cfg.hidden_size == \
        attention * (3 * 5 + 1 + 2 + 3)
