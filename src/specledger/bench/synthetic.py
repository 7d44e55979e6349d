"""Synthetic prompts of controlled length: deterministic filler text whose token count is known without a
tokenizer.

Synthetic questions (category "synthetic", kind summarization: "summarise these notes", no reference) have a
prompt of exactly `in` tokens for SmolLM2's Llama-family BPE tokenizer (tested; other Llama-family BPEs:
within a few percent) — the user message only: the chat template adds its own tokens (~30 for SmolLM2,
whose template inserts a default system prompt). `min_tokens` = `max_tokens` = `out`.
"""

from __future__ import annotations

import random
import re
from typing import Any

# Filler made of common English words that are one token (with a leading space) in Llama-family BPE
# vocabularies, so the estimate below (one token per word, punctuation mark and newline) is exact for
# SmolLM2's tokenizer (tested) and within a few percent for other Llama-family BPEs.

_ADJ = "small large old new quiet bright dark warm cold early late long short green blue red yellow".split()
_NOUN = (
    "river market garden village morning evening winter summer teacher farmer doctor student city road "
    "bridge house school window table letter story music water light stone field forest mountain harbor "
    "station train boat paper bread apple coffee friend family child worker report plan question answer"
).split()
_VERB = "walks carries builds opens closes finds keeps brings reads writes watches follows paints counts sells buys".split()
_PREP = "of to in on for with at from by about over under after before through near between".split()
_ADV = "slowly quickly often always never again together carefully happily".split()

SYNTHETIC_INSTRUCTION = "Read the notes below and write a detailed summary of them.\n\nNotes:"
_TOKEN_RE = re.compile(r"\w+|[^\w\s]|\n")


def estimate_tokens(text: str) -> int:
    """Words + punctuation marks + newlines: the token count of the synthetic filler."""
    return len(_TOKEN_RE.findall(text))


def truncate_tokens(text: str, n_tokens: int) -> str:
    """The start of `text` holding its first `n_tokens` estimated tokens."""
    marks = list(_TOKEN_RE.finditer(text))
    return text if n_tokens >= len(marks) else text[: marks[n_tokens - 1].end()] if n_tokens > 0 else ""


def template_overhead(tokenizer: Any) -> int:
    """Tokens a chat template adds around one user message (the engine's Tokenizer.chat), measured on filler
    whose token count is known."""
    sample = synthetic_prompt(64, 0)
    return len(tokenizer.chat([{"role": "user", "content": sample}])) - estimate_tokens(sample)


def fit_prompt(text: str, prompt_tokens: int, overhead: int | None) -> str:
    """Filler trimmed so that it and the template's `overhead` make `prompt_tokens` (None: overhead unknown, as is)."""
    return text if overhead is None else truncate_tokens(text, max(1, prompt_tokens - overhead))


def _sentence(rng: random.Random, size: int) -> str:
    """Exactly `size` estimated tokens: words plus the final period."""
    if size < 4:  # only for prompts shorter than four tokens: no room for a period
        return " ".join(["The", rng.choice(_ADJ), rng.choice(_NOUN)][:size])
    n = size - 1
    words = ["The", rng.choice(_ADJ), rng.choice(_NOUN), rng.choice(_VERB)][:n]
    while len(words) < n:
        room = n - len(words)
        if room == 1:
            words.append(rng.choice(_ADV))
        elif room == 2 or rng.random() < 0.3:
            words += ["the", rng.choice(_NOUN)]
        else:
            words += [rng.choice(_PREP + ["and"]), "the", rng.choice(_NOUN)]
    return " ".join(words) + "."


def synthetic_prompt(n_tokens: int, seed: int, *, instruction: bool = True) -> str:
    """Deterministic filler text of about `n_tokens` tokens, the instruction included when it fits (and wanted:
    a trace's later prompt blocks are filler only)."""
    rng = random.Random(f"synthetic/{seed}")
    parts: list[str] = []
    budget = n_tokens
    if instruction and n_tokens >= 2 * estimate_tokens(SYNTHETIC_INSTRUCTION):
        parts.append(SYNTHETIC_INSTRUCTION)
        budget -= estimate_tokens(SYNTHETIC_INSTRUCTION)
    while budget > 0:
        if budget <= 15:
            size = budget
        elif budget <= 22:
            size = budget // 2
        else:
            size = rng.randint(7, 15)
        parts.append(_sentence(rng, size))
        budget -= size
    return " ".join(parts)
