"""Qwen2 (a bias on Q, K and V) and Qwen3 (an RMSNorm per head on Q and K) beside Llama, in every path.

Tiny random models saved by transformers (safetensors) and a tiny qwen2 GGUF written with gguf.GGUFWriter:
teacher-forced fp32 logits equal transformers', greedy decoding through the batched scheduler equals each
request alone, the quantized products and the fused one-token layer stay within the quantized tests' bounds.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.engine.test_hf_conformance import VOCAB, assert_conforms
from tests.support.varied_model import alone, run_joining

from specledger.decoding.sampling import SamplingParams
from specledger.decoding.loop.scheduler import Scheduler
from specledger.engine.loader import load_model
from specledger.engine.cpu_ops import declines

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def save_qwen(d: Path, kind: str = "qwen2", **kw) -> Path:
    """A seeded tiny Qwen2 / Qwen3 model saved by transformers; biases and norms made far from their defaults."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    cls_cfg, cls_model = (Qwen2Config, Qwen2ForCausalLM) if kind == "qwen2" else (Qwen3Config, Qwen3ForCausalLM)
    args = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, max_position_embeddings=128, initializer_range=0.3,
                tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = cls_model(cls_cfg(**(args | kw)))
    with torch.no_grad():  # transformers starts biases at 0 and norms at 1, which any reading would match
        for name, p in model.named_parameters():
            if name.endswith("_proj.bias"):
                p.normal_(0, 1.0)
            elif name.endswith(("q_norm.weight", "k_norm.weight")):
                p.uniform_(0.3, 2.0)
    model.save_pretrained(d)
    return d


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_qwen_matches_transformers(tmp_path, kind):
    d = save_qwen(tmp_path / kind, kind)
    lm = load_model(str(d), with_tokenizer=False)
    assert lm.config.arch == kind
    assert (lm.config.qkv_bias, lm.config.qk_norm) == (kind == "qwen2", kind == "qwen3")
    assert_conforms(d)


def test_qwen2_tied_gqa_one_kv_head(tmp_path):
    assert_conforms(save_qwen(tmp_path / "t", num_key_value_heads=1, tie_word_embeddings=True), steps=8)


def test_qwen3_attention_bias_is_refused(tmp_path):
    from specledger.errors import UnsupportedModel

    d = save_qwen(tmp_path / "b", "qwen3", attention_bias=True)
    with pytest.raises(UnsupportedModel, match="attention_bias=true"):
        load_model(str(d), with_tokenizer=False)


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (14, 5, 9, 3)]


@pytest.mark.parametrize("kind,quant", [("qwen2", "none"), ("qwen3", "none"), ("qwen2", "int4"), ("qwen3", "int8")])
def test_batched_greedy_equals_each_request_alone(tmp_path, kind, quant):
    """The ragged pass (ragged.py) adds the bias / norms as the single-sequence pass does. fp32 activations: in
    bf16 a batch's rows round differently from one row's (test_batching.py holds bf16 to a tolerance, not tokens)."""
    lm = load_model(str(save_qwen(tmp_path / kind, kind)), with_tokenizer=False, quant=quant, dtype="fp32")
    prompts, max_new = _prompts(), [12, 20, 9, 16]
    results = run_joining(Scheduler(lm, max_batch=3, prefill_chunk=4), prompts, max_new)
    for i, p in enumerate(prompts):
        want = alone(lm, p, SamplingParams(max_tokens=max_new[i], temperature=0.0, ignore_eos=True))
        got = results[i].token_ids
        assert got == want.token_ids[: len(got)] and len(got) > 0, i


def on_the_grid(d: Path, quant: str):
    """The quantized model and an fp32 model of the same grid's dequantized weights (output layer int8 in both):
    they differ only by the kernel's activation rounding, so a bias or a norm lost in one path shows."""
    from specledger.engine import hf_loader
    from specledger.engine.loader import build_model
    from specledger.engine.quant import int4_grid, int8_grid

    cfg = hf_loader.read_config(d)
    tensors = hf_loader.read_tensors(d, cfg)
    grids: dict = {}
    exact = dict(tensors)
    for key, w in tensors.items():
        if w.dim() == 2 and key != "embed":
            g = int8_grid(w) if quant == "int8" or key == "output" else int4_grid(w, 32)
            if key != "output":
                grids[key] = g
            exact[key] = g.dequantize() if quant == "int8" or key == "output" else _dequantize4(g)
    return (build_model(cfg, tensors, grids, dtype="bf16", quant=quant), build_model(cfg, exact, dtype="fp32"))


def _dequantize4(g) -> torch.Tensor:
    n, k = g.codes.shape
    w = (g.codes.float() - 8).reshape(n, k // 32, 32) * g.scale[..., None] + g.zero[..., None]
    return w.reshape(n, k)


@pytest.mark.parametrize("kind,quant", [("qwen2", "int4"), ("qwen2", "int8"), ("qwen3", "int4"), ("qwen3", "int8")])
def test_quantized_equals_fp32_on_the_same_grid(tmp_path, kind, quant):
    """W4A16 / W8A16 (bf16 activations; the fused one-token layer for qwen2) against fp32 on the same weights,
    within about test_qkernel's bounds for a whole model (relative 0.03 there; 0.05 here: this chaotic model's
    bf16 rounding of a bias of ~1 alone costs ~0.04), top-1 > 0.9."""
    model, ref_model = on_the_grid(save_qwen(tmp_path / kind, kind), quant)
    ids = torch.tensor([_prompts()[0] * 2])
    ref = ref_model(ids, ref_model.new_cache(64))
    out = model(ids, model.new_cache(64)).float()
    assert ref.std() > 0.5
    assert (out - ref).norm() / ref.norm() < 0.05 and (out.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9
    cache, ref_cache = model.new_cache(64), ref_model.new_cache(64)  # one token at a time: the one-token paths
    steps = torch.cat([model(ids[:, j : j + 1], cache) for j in range(ids.shape[1])], 1).float()
    ref_steps = torch.cat([ref_model(ids[:, j : j + 1], ref_cache) for j in range(ids.shape[1])], 1)
    assert (steps - ref_steps).norm() / ref_steps.norm() < 0.05


@pytest.mark.kernel
@pytest.mark.parametrize("quant,dtype", [("int4", "bf16"), ("int8", "bf16"), ("int4", "fp32")])
def test_fused_layer_adds_the_bias_as_op_by_op(tmp_path, quant, dtype):
    """Qwen2's bias inside the fused one-token layer (csrc/fused.cpp decode_layer): the same bits as op by op."""
    from specledger.engine import qkernel

    if qkernel.op() is None:
        pytest.skip("the engine's kernel is unavailable on this host")
    lm = load_model(str(save_qwen(tmp_path / "q", "qwen2")), with_tokenizer=False, quant=quant, dtype=dtype)
    ids = _prompts()[0]
    ops = lm.model.ops
    took: list[bool] = []

    def counted(*args):
        y = ops.decode_layer(*args)
        took.append(y is not None)
        return y

    def run() -> torch.Tensor:
        cache = lm.model.new_cache(32)
        return torch.cat([lm.model(torch.tensor([[t]]), cache) for t in ids], 1)

    lm.model.use_ops(replace(ops, decode_layer=counted))
    got = run()
    assert took and all(took)
    lm.model.use_ops(replace(ops, decode_layer=declines))
    assert torch.equal(got, run())


def test_qwen3_takes_the_op_by_op_path(tmp_path):
    """The per-head norms are not in the fused layer: it declines, so they are never skipped."""
    lm = load_model(str(save_qwen(tmp_path / "q", "qwen3")), with_tokenizer=False, quant="int4")
    x = torch.zeros(1, 1, 128)
    cache = lm.model.new_cache(8)
    cos, sin = lm.model.rope_cos[:1], lm.model.rope_sin[:1]
    layer = lm.model.layers[0]
    assert lm.model.ops.decode_layer(layer, x, cos, sin, cache.slot_k[0][0][None], cache.slot_v[0][0][None], 0) is None


# ---- GGUF -------------------------------------------------------------------------------------------------


def write_qwen_gguf(path: Path, hf_dir: Path, arch: str = "qwen2", encode=None) -> None:
    """The HF model's tensors under GGUF's names for a qwen2/qwen3 file, as llama.cpp's converter writes them
    (F32, Q and K NOT permuted: qwen rotates the halves, llama.cpp's NEOX RoPE), with a gpt2 vocabulary.
    encode(gguf_name, fp32 array) -> (bytes array, GGML type) or None: store that tensor quantized."""
    import gguf
    from safetensors.torch import load_file

    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(hf_dir)
    sd = load_file(str(hf_dir / "model.safetensors"))
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(c.vocab_size)])
    w.add_token_types([1] * c.vocab_size)
    w.add_eos_token_id(2)
    names = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight"}
    for p in ("q", "k", "v", "o"):
        names[f"self_attn.{p}_proj.weight"] = f"attn_{'output' if p == 'o' else p}.weight"
        names[f"self_attn.{p}_proj.bias"] = f"attn_{p}.bias"
    names |= {"self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
              "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
              "mlp.down_proj.weight": "ffn_down.weight"}
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    for name, t in sd.items():
        if name in top:
            out = top[name]
        else:
            _, _, idx, rest = name.split(".", 3)
            out = f"blk.{idx}.{names[rest]}"
        coded = encode(out, t.float().numpy()) if encode is not None else None
        if coded is None:
            w.add_tensor(out, np.ascontiguousarray(t.float().numpy()))
        else:
            w.add_tensor(out, coded[0], raw_dtype=coded[1])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_gguf_qwen_reads_as_the_hf_model(tmp_path, kind):
    """The GGUF loader's names (attn_q.bias, attn_q_norm, qwen*.* keys) and no Q/K un-permutation for qwen."""
    d = save_qwen(tmp_path / "hf", kind)
    f = tmp_path / f"{kind}.gguf"
    write_qwen_gguf(f, d, kind)
    ours = load_model(str(f), with_tokenizer=False)
    ref = load_model(str(d), with_tokenizer=False)
    assert (ours.config.arch, ours.config.qkv_bias, ours.config.qk_norm) == (kind, kind == "qwen2", kind == "qwen3")
    ids = torch.tensor([_prompts()[0]])
    a = ours.model(ids, ours.model.new_cache(32))
    b = ref.model(ids, ref.model.new_cache(32))
    assert b.std() > 0.5 and (a - b).abs().max().item() < 1e-4


def test_gguf_llama_with_biases_is_refused(tmp_path):
    """A llama file's Q/K rows are un-permuted; biases would need the same, which nothing writes: refused by name."""
    from specledger.errors import UnsupportedModel

    f = tmp_path / "llama-bias.gguf"
    write_qwen_gguf(f, save_qwen(tmp_path / "hf", "qwen2"), "llama")
    with pytest.raises(UnsupportedModel, match="llama file with attention biases"):
        load_model(str(f), with_tokenizer=False)
