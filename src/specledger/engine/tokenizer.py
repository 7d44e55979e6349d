"""Tokenizer and chat template, from GGUF metadata or a model directory (via transformers)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from specledger.errors import BadInput


def cache_dir() -> Path:
    base = os.environ.get("SPECLEDGER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "specledger"
    )
    return Path(base)


class Tokenizer:
    def __init__(self, hf_tokenizer, eos_ids: set[int]) -> None:
        self.hf = hf_tokenizer
        self.eos_ids = set(eos_ids)
        self.vocab_size = len(hf_tokenizer)

    @classmethod
    def from_gguf(cls, path: Path, eos_ids: set[int]) -> "Tokenizer":
        from transformers import AutoTokenizer

        st = path.stat()
        key = hashlib.sha1(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
        cached = cache_dir() / "tokenizers" / key
        if (cached / "tokenizer.json").exists():
            tok = AutoTokenizer.from_pretrained(cached)
        else:  # converting the GGUF vocabulary takes seconds: do it once
            tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            try:
                tok.save_pretrained(cached)
            except OSError:
                pass
        return cls(tok, eos_ids)

    @classmethod
    def from_dir(cls, path: Path, eos_ids: set[int]) -> "Tokenizer":
        from transformers import AutoTokenizer

        try:
            return cls(AutoTokenizer.from_pretrained(path), eos_ids)
        except (OSError, ValueError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise BadInput(f"{path}: no tokenizer transformers can load ({first}); add the tokenizer files") from None

    def encode(self, text: str) -> list[int]:
        return list(self.hf(text, add_special_tokens=True)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True)

    def chat_text(self, messages: list[dict]) -> str:
        """The conversation's text, ending where the assistant speaks next; a trailing assistant message is the
        start of its answer, given (a prefill, as llama-server and vLLM's continue_final_message), and is continued."""
        if not getattr(self.hf, "chat_template", None):
            raise BadInput("this model has no chat template; use raw prompts (--raw)")
        if messages and messages[-1].get("role") == "assistant":
            return self.hf.apply_chat_template(messages, tokenize=False, continue_final_message=True)
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def chat(self, messages: list[dict], check: Callable[[str], None] | None = None) -> list[int]:
        """Prompt ids for a conversation, ending with the assistant's generation prompt; check: called with the
        conversation's text before it is tokenized (the server refuses one too long to fit there)."""
        text = self.chat_text(messages)
        if check is not None:
            check(text)
        return self.encode_text(text)

    def encode_text(self, text: str) -> list[int]:
        """Ids of text that already carries its special tokens (a chat template's output)."""
        return list(self.hf(text, add_special_tokens=False)["input_ids"])
