"""Hugging Face directories: every form transformers writes or accepts loads with transformers' own logits,
every form the engine does not implement is refused by name. Tiny random models saved by transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specledger.decoding.factory import make_strategy
from specledger.decoding.loop.generate import generate
from specledger.decoding.sampling import SamplingParams
from specledger.engine.loader import load_model
from specledger.errors import BadInput, UnsupportedModel

VOCAB = 300
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def save_model(d: Path, *, kind: str = "llama", rope: dict | None = None, old_style: bool = False,
               torch_dtype: bool = False, dtype: torch.dtype = torch.float32, shard: str | None = None,
               edit: dict | None = None, **kw) -> Path:
    """A seeded tiny model saved by transformers; old_style rewrites the RoPE block as older checkpoints spell it."""
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    cls_cfg, cls_model = (LlamaConfig, LlamaForCausalLM) if kind == "llama" else (MistralConfig, MistralForCausalLM)
    args = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.3, tie_word_embeddings=False,
                rope_parameters=rope or {"rope_type": "default", "rope_theta": 500000.0}, bos_token_id=1,
                eos_token_id=2)
    if kind == "mistral":
        args["sliding_window"] = None
    torch.manual_seed(0)
    model = cls_model(cls_cfg(**(args | kw))).to(dtype)
    model.save_pretrained(d, max_shard_size=shard) if shard else model.save_pretrained(d)
    c = json.loads((d / "config.json").read_text())
    if old_style:  # what checkpoints written before transformers 5 hold
        rp = c.pop("rope_parameters")
        c["rope_theta"] = rp.pop("rope_theta")
        c["rope_scaling"] = None if rp["rope_type"] == "default" else rp
    if torch_dtype:
        c["torch_dtype"] = c.pop("dtype")
    c |= edit or {}
    (d / "config.json").write_text(json.dumps(c, indent=2))
    return d


def save_tokenizer(d: Path) -> None:
    """A tiny byte-level BPE tokenizer (fits VOCAB) saved the way transformers saves any tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from specledger.data import quality_text

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 3, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([quality_text()], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(d)


def hf_model(d: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()


def assert_conforms(d: Path, ids: list[int] | None = None, steps: int = 16) -> None:
    """fp32 logits equal transformers' at every position, and greedy decoding picks the same tokens."""
    lm = load_model(str(d), dtype="fp32", with_tokenizer=False)
    hf = hf_model(d)
    ids = ids or torch.randint(3, VOCAB, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    x = torch.tensor([ids])
    with torch.no_grad():
        ref = hf(x).logits[0]
        ours = lm.model(x, lm.model.new_cache(len(ids)))[0]
        assert ref.std() > 0.5  # not a near-uniform model that any reading would match
        assert (ref - ours).abs().max().item() < 1e-4
        hf_out = hf.generate(x, max_new_tokens=steps, do_sample=False, eos_token_id=None, pad_token_id=0)
    res = generate(make_strategy("ar", lm), ids, SamplingParams(max_tokens=steps, ignore_eos=True))
    assert res.token_ids == hf_out[0, len(ids):].tolist()


FORMS = {
    "rope_parameters": dict(),
    "old_style_rope_theta": dict(old_style=True),
    "llama3_rope_parameters": dict(rope=LLAMA3 | {"rope_theta": 500000.0}),
    "llama3_old_style": dict(rope=LLAMA3 | {"rope_theta": 500000.0}, old_style=True),
    "linear_old_style": dict(rope={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}, old_style=True,
                             edit={"rope_scaling": {"type": "linear", "factor": 4.0}}),
    "gqa_1kv_sharded": dict(num_key_value_heads=1, shard="40KB"),
    "mha_tied": dict(num_key_value_heads=4, tie_word_embeddings=True),
    "head_dim_32": dict(head_dim=32),
    "bf16_torch_dtype": dict(dtype=torch.bfloat16, torch_dtype=True),
    "mistral_no_window": dict(kind="mistral"),
    "mistral_window_covers_context": dict(kind="mistral", sliding_window=128),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_form_matches_transformers(tmp_path, form):
    d = save_model(tmp_path / form, **FORMS[form])
    if form == "gqa_1kv_sharded":
        assert len(list(d.glob("model-*.safetensors"))) > 3 and (d / "model.safetensors.index.json").exists()
    assert_conforms(d)


def test_config_is_read_as_transformers_reads_it(tmp_path):
    from specledger.engine.hf_loader import read_config

    cfg = read_config(save_model(tmp_path / "a", **FORMS["llama3_old_style"]))
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling["rope_type"] == "llama3" and cfg.rope_scaling["factor"] == 8
    cfg = read_config(save_model(tmp_path / "b", num_key_value_heads=1, head_dim=32, tie_word_embeddings=True))
    assert (cfg.n_kv_heads, cfg.head_dim, cfg.tie_embeddings, cfg.rope_scaling) == (1, 32, True, None)


def test_tied_checkpoint_with_a_stored_lm_head(tmp_path):
    """tie_word_embeddings but a different lm_head.weight in the file: whichever transformers uses, we use."""
    from safetensors.torch import load_file, save_file

    d = save_model(tmp_path / "t", tie_word_embeddings=True)
    f = d / "model.safetensors"
    sd = load_file(str(f))
    sd["lm_head.weight"] = torch.randn(VOCAB, 64)
    save_file(sd, str(f), metadata={"format": "pt"})
    assert_conforms(d, steps=4)


def test_sharded_directory_reads_only_the_indexed_files(tmp_path):
    """A stray consolidated.safetensors (original-format weights) next to the shards is not read."""
    from safetensors.torch import save_file

    d = save_model(tmp_path / "s", shard="60KB")
    save_file({"tok_embeddings.weight": torch.zeros(VOCAB, 64)}, str(d / "consolidated.safetensors"))
    assert_conforms(d, steps=4)


def test_generate_with_a_tokenizer_in_the_directory(tmp_path):
    d = save_model(tmp_path / "tok")
    save_tokenizer(d)
    lm = load_model(str(d))
    ids = lm.tokenizer.encode("The committee met in November")
    assert_conforms(d, ids=ids, steps=8)


def _refused(d: Path, needle: str, exc=UnsupportedModel) -> None:
    with pytest.raises(exc) as info:
        load_model(str(d), with_tokenizer=False)
    msg = str(info.value)
    assert needle in msg and "\n" not in msg, msg


@pytest.mark.parametrize(
    "edit,needle",
    [
        ({"model_type": "phi3", "architectures": ["Phi3ForCausalLM"]}, "model_type='phi3'"),
        ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "model_type='gpt2'"),
        ({"architectures": ["LlamaForSequenceClassification"]}, "architectures=['LlamaForSequenceClassification']"),
        ({"attention_bias": True}, "attention_bias=true"),
        ({"mlp_bias": True}, "mlp_bias=true"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                              "original_max_position_embeddings": 32}}, "rope_type='yarn'"),
        ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}}, "rope_type='dynamic'"),
        ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8,
                              "long_factor": [2.0] * 8, "original_max_position_embeddings": 32}},
         "rope_type='longrope'"),
        ({"rope_parameters": None, "rope_theta": 10000.0, "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                                           "original_max_position_embeddings": 32}},
         "rope_type='yarn'"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
         "partial_rotary_factor=0.5"),
        ({"quantization_config": {"quant_method": "gptq", "bits": 4}}, "quant_method='gptq'"),
    ],
)
def test_unsupported_llama_settings_are_refused_by_name(tmp_path, edit, needle):
    _refused(save_model(tmp_path / "m", edit=edit), needle)


def test_sliding_window_is_refused(tmp_path):
    _refused(save_model(tmp_path / "w", kind="mistral", sliding_window=16), "sliding_window=16")


def test_untied_without_lm_head_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    d = save_model(tmp_path / "u")
    sd = load_file(str(d / "model.safetensors"))
    del sd["lm_head.weight"]
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    _refused(d, "lm_head.weight", BadInput)


def test_bias_tensor_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    d = save_model(tmp_path / "b")
    sd = load_file(str(d / "model.safetensors"))
    sd["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    _refused(d, "model.layers.0.self_attn.q_proj.bias")


def test_directory_without_a_tokenizer_says_so(tmp_path):
    d = save_model(tmp_path / "n")
    with pytest.raises(BadInput, match="no tokenizer"):
        load_model(str(d))


# ---- specledger models --check ------------------------------------------------------------------------------


def _cli(*args):
    from typer.testing import CliRunner

    from specledger.cli import app

    return CliRunner().invoke(app, list(args))


def test_models_check_passes_on_a_model_read_right(tmp_path):
    d = save_model(tmp_path / "ok")
    save_tokenizer(d)
    r = _cli("models", "--check", str(d), "--tokens", "32")
    assert r.exit_code == 0, r.output
    assert "max |logit difference|" in r.output and "MATCH" in r.output and "MISMATCH" not in r.output
    assert "(tokenizer)" in r.output


def test_models_check_fails_on_a_model_read_wrong(tmp_path, monkeypatch):
    """The bug this check exists for: a RoPE base silently read as 10000."""
    from specledger.engine import hf_loader

    real = hf_loader.read_config

    def misread(path):
        cfg = real(path)
        cfg.rope_theta = 10000.0
        return cfg

    monkeypatch.setattr(hf_loader, "read_config", misread)
    r = _cli("models", "--check", str(save_model(tmp_path / "bad")), "--tokens", "32")
    assert r.exit_code == 2, r.output
    assert "MISMATCH" in r.output and "(random)" in r.output
