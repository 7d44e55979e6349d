"""The most text a context can hold, read off the tokenizer: a longer prompt is refused before it is tokenized.

No token stands for more text than the vocabulary's longest entry, so a prompt longer than that entry times the
context cannot fit, whatever its tokens turn out to be; tokenizing it would only spend seconds of CPU (970k emoji:
15 s) to say so. A byte-level BPE (GPT-2, SmolLM2, Qwen, Llama 3) spells its entries one character per byte: its
bound is in UTF-8 bytes, which is tighter for text outside ASCII. Other vocabularies (SentencePiece) bound
characters. A Unicode normalizer (NFC, NFKC, lower-casing) can fold up to 4 code points (or 4 bytes: U+1D400 is
"A") into one, and a string replacement its pattern into its replacement: the bound grows by those factors.

Some tokenizers have no such bound: a normalizer or pre-tokenizer that deletes text (strip, BERT's cleaning,
whitespace splitting, a replacement by nothing), or a model that folds a run of unknown characters into one token.
For them `text_bound` is None and only --max-prompt-chars applies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

FOLD = 4  # code points (or UTF-8 bytes) a Unicode normalization may fold into one
_UNICODE = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase"}
_KEEPS = {"ByteLevel", "Metaspace", "Digits", "UnicodeScripts", "Split", "Punctuation"}  # (Split, Punctuation: unless
# their behavior is "Removed")


@dataclass(frozen=True)
class TextBound:
    """At most `per_token` units of text (UTF-8 bytes when `in_bytes`, else characters) per token."""

    per_token: int
    in_bytes: bool

    def size(self, text: str) -> int:
        return len(text.encode("utf-8", "surrogatepass")) if self.in_bytes else len(text)

    @property
    def unit(self) -> str:
        return "bytes of UTF-8" if self.in_bytes else "characters"


def text_bound(hf_tokenizer: Any) -> TextBound | None:
    """The bound of a transformers tokenizer (a fast one: its `backend_tokenizer`), or None (module docstring)."""
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow (Python) tokenizer: nothing to read the rules from
        return None
    spec = json.loads(backend.to_str())
    fold = _normalizer_fold(spec.get("normalizer"))
    pre = _kinds(spec.get("pre_tokenizer"))
    if fold is None or pre is None:
        return None
    model = spec.get("model") or {}
    kind, vocab = model.get("type"), model.get("vocab")
    if kind not in ("BPE", "Unigram") or not vocab:  # (WordLevel, WordPiece: a whole word may be one token or UNK)
        return None
    unknown = model.get("unk_token") if kind == "BPE" else model.get("unk_id")
    if unknown is not None and not model.get("byte_fallback") and (kind == "Unigram" or model.get("fuse_unk")):
        return None  # a run of unknown characters becomes one token
    entries = list(vocab) if isinstance(vocab, dict) else [piece for piece, _score in vocab]
    added = [t["content"] for t in spec.get("added_tokens") or []]
    in_bytes = "ByteLevel" in pre
    longest = max([len(e) for e in entries] + [len(a.encode("utf-8")) if in_bytes else len(a) for a in added])
    # one unknown character (without byte fallback) is one token: at most 4 bytes
    return TextBound(max(longest, 4 if in_bytes else 1) * fold, in_bytes)


def _kinds(pre: dict | None) -> set[str] | None:
    """The pre-tokenizers' types, or None if one of them may delete text."""
    if pre is None:
        return set()
    if pre.get("type") == "Sequence":
        parts = [_kinds(p) for p in pre.get("pretokenizers", [])]
        return None if any(p is None for p in parts) else set().union(*parts)  # type: ignore[arg-type]
    kind = pre.get("type")
    if kind not in _KEEPS or str(pre.get("behavior", "")).lower() == "removed":
        return None
    return {kind}


def _normalizer_fold(norm: dict | None) -> int | None:
    """How many units of input one unit of normalized text may stand for, or None if it may delete text."""
    if norm is None:
        return 1
    kind = norm.get("type")
    if kind == "Sequence":
        fold = 1
        for part in norm.get("normalizers", []):
            f = _normalizer_fold(part)
            if f is None:
                return None
            fold *= f
        return fold
    if kind in _UNICODE:
        return FOLD
    if kind == "Prepend":
        return 1
    if kind == "Replace":
        pattern, content = (norm.get("pattern") or {}).get("String"), norm.get("content") or ""
        if not pattern or not content:  # a regular expression, or a replacement by nothing
            return None
        return max(1, -(-len(pattern.encode()) // len(content.encode())), -(-len(pattern) // len(content)))
    return None  # Strip, StripAccents, BertNormalizer, NMT, Precompiled (SentencePiece's tables) ...
