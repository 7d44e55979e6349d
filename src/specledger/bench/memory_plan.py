"""Before a run loads anything: its predicted peak memory, and the groups of arms that fit the memory it may use.

The prediction, per arm: the weights of each model it holds, as engine/roofline.py's `model_bytes` counts the loaded
layout from the file's header and the precision (no weights read), counted once for every arm that shares them (the
same file at the same precision: an A/A twin, a draft or intermediate several arms use; W4A16 and W4A8 of the same
codes, which bench/shared_models.py loads once), with PER_MODEL for its tokenizer and allocator slack and its file
once (read through a mapping); the KV cache of its slots (as many as the run has requests in flight) at the longest
conversation the workload can build (counted with the model's tokenizer), and the host memory each model's runner may
fill with parked prompts (decoding/loop/runner.py PARK_BYTES, where the prefix cache is on); a managed server's model
files (llama-server maps them). Plus, once, what loading holds for a moment (the widest model's fp32 embedding and one
fp32 layer) and this process as it is now. The quantization gate's fp32 references are read before any arm, one at a
time (bench/shared_models.read_references): a peak of their own, one reference alone; what is kept of each, its
log-probabilities over the quality text, is held by every group.

The budget: SPECLEDGER_MEMORY_BUDGET (bytes, or with K/M/G: "8G") where given, else the memory available now plus this
process's own. An interleaved run whose arms do not fit together runs them in groups that do: interleaving (and
every level's seeded order) holds within a group; every group after the first also runs a copy of one `ar` arm,
the anchor (named `<arm>@group<k>`), which pairing reads as the anchor's A/A twin, so the drift between groups is a
ratio the report shows. A run one arm of which does not fit alone (with the anchor) is refused in one line naming
the arm and the bytes, before anything is loaded; an out-of-memory kill is never the answer.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Iterable

import psutil

from specledger.engine.config import ModelConfig
from specledger.engine.tokenizer import Tokenizer
from specledger.engine.pool import Key
from specledger.errors import BadInput, SpecLedgerError
from specledger.records.config import BenchConfig, RunConfig
from specledger.records.question import Question
from specledger.records.results import ConfigResult

ENV = "SPECLEDGER_MEMORY_BUDGET"
GROUP_TAG = "@group"
# beside a loaded model's weights: its tokenizer and what the allocator keeps of the load's transient arrays (47-69 MB
# per SmolLM2 load measured on EPYC-512, 2026-12-06); the model file's mapped pages are counted apart, once a file
PER_MODEL = 64 * 2**20
# what the count leaves out (the run's own arrays, results, fragmentation): SmolLM2 at W4A16, W4A8, bf16 and fp32 in one
# group peaked at 1.99 GiB against 1.84 GiB counted; in two groups (ar-w4 + ar-fp32 the larger) at 1.50 GiB against
# 1.42 GiB predicted with a headroom of 1.1 (EPYC-512, busy, 2026-12-06)
HEADROOM = 1.2
# positions a slot may hold past its prompt and answer: a few where the prompt's count (prompt_tokens) and the
# template's own tokenization differ by a merge; where a step verifies drafts, a draft tree's nodes past the answer's
# last token (a chain is capped at what is left of the answer's budget, a tree's width is not)
PAST_AR, PAST_SPECULATION = 8, 64
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
KeysOf = Callable[[BenchConfig], dict[str, Key]]  # role -> the pool key of the model it uses (SharedModels.keys)
ReferenceOf = Callable[[BenchConfig], "Key | None"]  # the gate's fp32 reference of an arm (SharedModels.reference_key)


def parse_bytes(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if m is None or float(m.group(1)) <= 0:
        raise BadInput(f"{ENV}={text!r}: expected a size such as 8G, 512M or a number of bytes")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def process_rss() -> int:
    """This process's resident bytes now: what the run holds before it loads anything."""
    return psutil.Process().memory_info().rss


def budget() -> tuple[int, str]:
    """The bytes this run may hold at its peak, and where that figure comes from."""
    given = os.environ.get(ENV)
    if given:
        return parse_bytes(given), ENV
    return psutil.virtual_memory().available + process_rss(), "memory available now"


def gb(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"  # the budget's units (8G: 8 GiB)


@lru_cache(maxsize=64)
def _config(model: str) -> ModelConfig | None:
    """The model's shape from its header; None where it cannot be read here (loading it will say why)."""
    from specledger.engine.loader import read_model_config

    try:
        return read_model_config(model)
    except Exception:  # noqa: BLE001 - any unreadable file: counted as nothing, refused later by the loader
        return None


def weights_id(key: Key) -> Key:
    """What holds the same weights: the key without its activation bits (W4A16 and W4A8 share their codes)."""
    return key[:5] + key[6:]


def weights_bytes(key: Key) -> int:
    """A loaded model's weights and PER_MODEL (0 where its file cannot be read here: loading it will say why)."""
    from specledger.engine.roofline import Precision, model_bytes

    model, dtype, quant, group, _device, act = key[:6]
    cfg = _config(model)
    if cfg is None:
        return 0
    return model_bytes(cfg, Precision(dtype, quant, group or 32, act)).resident + PER_MODEL


def file_bytes(model: str) -> int:
    """The model's file (or directory) size: what reading it maps."""
    from specledger.engine.registry import resolve_model

    try:
        path = resolve_model(model)
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size
    except (SpecLedgerError, OSError):
        return 0


def load_transient(key: Key) -> int:
    """What loading this model holds for a moment beside the model: its fp32 embedding and one fp32 layer."""
    from specledger.engine.roofline import layer_products

    cfg = _config(key[0])
    if cfg is None:
        return 0
    return 4 * (cfg.vocab_size * cfg.hidden_size + sum(o * i for o, i in layer_products(cfg)))


def logprob_bytes(key: Key) -> int:
    """What the run keeps of a reference: its fp32 log-probabilities over the quality text (about 3 characters a
    token, at most probes.AGREEMENT_TOKENS)."""
    from specledger.bench.probes import AGREEMENT_TOKENS
    from specledger.data import quality_text

    cfg = _config(key[0])
    if cfg is None:
        return 0
    return 4 * cfg.vocab_size * min(AGREEMENT_TOKENS, cfg.max_seq_len, len(quality_text()) // 3)


def reading_bytes(key: Key) -> int:
    """Reading a reference: its weights, its file, loading's transient arrays and its logits."""
    return weights_bytes(key) + file_bytes(key[0]) + load_transient(key) + logprob_bytes(key)


def kv_bytes(key: Key, slots: int, context: int) -> int:
    """A slot cache's bytes for `slots` sequences of `context` tokens (its time axis doubles from 256)."""
    from specledger.engine.roofline import Precision, kv_bytes_per_position, kv_element_bytes

    cfg = _config(key[0])
    if cfg is None:
        return 0
    capacity = 256
    while capacity < min(context, cfg.max_seq_len):
        capacity *= 2
    element = kv_element_bytes(Precision(key[1], key[2], key[3] or 32, key[5]), key[4])
    return slots * min(capacity, cfg.max_seq_len) * kv_bytes_per_position(cfg, element)


@lru_cache(maxsize=16)
def _tokenizer(model: str) -> Tokenizer | None:
    """The model's tokenizer, read without its weights; None where it cannot be read here."""
    from specledger.engine.registry import resolve_model

    try:
        path = resolve_model(model)
        return Tokenizer.from_dir(path, set()) if path.is_dir() else Tokenizer.from_gguf(path, set())
    except Exception:  # noqa: BLE001 - any unreadable tokenizer: the character estimate instead
        return None


def _template_tokens(tok: Tokenizer, q: Question) -> int:
    """What the chat template adds to a conversation of q's shape (its turns, system message and prefill, with
    empty texts): role markers, a default system prompt. Raw prompts (no template): the special tokens alone."""
    turns: list[dict[str, str]] = []
    for i in range(len(q.turns)):  # each turn but the last is answered (its answer counted apart: max_tokens)
        turns += [{"role": "user", "content": ""}] + ([{"role": "assistant", "content": ""}]
                                                      if i < len(q.turns) - 1 else [])
    system = [{"role": "system", "content": ""}] if q.system is not None else []
    shape = system + turns + ([{"role": "assistant", "content": ""}] if q.prefill is not None else [])
    try:
        return len(tok.chat(shape))
    except Exception:  # noqa: BLE001 - no chat template (the model takes raw prompts), or one that refuses the shape
        return len(tok.encode(""))


def prompt_tokens(questions: list[Question], tok: Tokenizer | None) -> list[int]:
    """Each question's prompt in the model's tokens: its texts (turns, system message, prefill) counted apart, plus
    what the template adds to a conversation of its shape (a few tokens more or less than the template's own
    tokenization, where words merge across a boundary: arm_cost's slack covers them). Without the tokenizer, 3
    characters a token (an over-estimate for English prose and code). A count the workload gives is kept."""
    texts = [[*q.turns, q.system or "", q.prefill or ""] for q in questions]
    if tok is None:
        return [q.prompt_tokens or sum(map(len, t)) // 3 for q, t in zip(questions, texts)]
    flat = [x for t in texts for x in t]
    ids = tok.hf(flat, add_special_tokens=False)["input_ids"] if flat else []
    overhead: dict[tuple[int, bool, bool], int] = {}
    counts, i = [], 0
    for q, t in zip(questions, texts):
        shape = (len(q.turns), q.system is not None, q.prefill is not None)
        if shape not in overhead:
            overhead[shape] = _template_tokens(tok, q)
        counts.append(q.prompt_tokens or sum(len(x) for x in ids[i:i + len(t)]) + overhead[shape])
        i += len(t)
    return counts


def context_tokens(questions: Iterable[Question], max_tokens: int, tok: Tokenizer | None = None) -> int:
    """The longest conversation a workload can build in the model's tokens: its prompt (prompt_tokens) and every
    turn's answer."""
    questions = list(questions)
    return max((n + len(q.turns) * (q.max_tokens or max_tokens) for q, n in zip(questions, prompt_tokens(questions,
                                                                                                          tok))),
               default=0)


def _server_bytes(bc: BenchConfig) -> int:
    """A managed server's model files (mapped whole); 0 for a server the run does not start."""
    from specledger.engine.registry import resolve_model

    server = bc.openai.server if bc.openai is not None else None
    if server is None:
        return 0
    total = 0
    for name in (bc.model, server.draft_model):
        try:
            total += resolve_model(name).stat().st_size if name else 0
        except (SpecLedgerError, OSError):
            pass
    return total


@dataclass
class ArmCost:
    name: str
    weights: dict[Key, int]  # weights id -> bytes
    files: dict[str, int]  # model file -> its bytes (mapped while it is read; once per file)
    own: int  # KV caches, a server's files
    transient: int

    def alone(self) -> int:
        return sum(self.weights.values()) + sum(self.files.values()) + self.own + self.transient


def in_flight(cfg: RunConfig) -> int | None:
    """The most requests a run has in flight at once: its closed-loop levels and its quality pass (None: an open-loop
    rate or a trace replay, unbounded)."""
    if cfg.load.rate or cfg.load.replay:
        return None
    return max([*(cfg.load.concurrency or [1]), cfg.quality.concurrency if cfg.quality is not None else 1])


def arm_cost(bc: BenchConfig, keys_of: KeysOf, context: int, in_flight: int | None = None) -> ArmCost:
    """`in_flight`: the most requests the run ever has in flight (None: unbounded, an open-loop load); an arm's KV
    cache holds that many slots at most, not every slot of its batch."""
    if bc.backend != "inprocess":
        return ArmCost(bc.name, {}, {}, _server_bytes(bc), 0)
    keys = keys_of(bc)
    weights = {weights_id(k): weights_bytes(k) for k in keys.values()}
    slots = bc.batch_size if in_flight is None else min(bc.batch_size, in_flight)
    kv = sum(kv_bytes(k, slots, context + (PAST_AR if bc.strategy == "ar" else PAST_SPECULATION)) for k in keys.values())
    if bc.prefix_cache:  # each model's runner parks evicted prompts in host memory, up to PARK_BYTES
        from specledger.decoding.loop.runner import PARK_BYTES

        kv += PARK_BYTES * len(keys)
    files = {k[0]: file_bytes(k[0]) for k in keys.values()}
    return ArmCost(bc.name, weights, files, kv, max((load_transient(k) for k in keys.values()), default=0))


def group_bytes(costs: Iterable[ArmCost], base: int) -> int:
    costs = list(costs)
    weights: dict[Key, int] = {}
    files: dict[str, int] = {}
    for c in costs:
        weights.update(c.weights)
        files.update(c.files)
    counted = sum(weights.values()) + sum(files.values()) + sum(c.own for c in costs) + max((c.transient for c in costs),
                                                                                              default=0)
    return base + int(counted * HEADROOM)


@dataclass
class MemoryPlan:
    budget: int
    source: str  # where the budget comes from
    groups: list[list[BenchConfig]]
    peaks: list[int]  # the predicted peak of each group
    added: list[BenchConfig] = field(default_factory=list)  # the anchor's copies, one per group after the first
    lean: bool = False  # one arm at a time, and the models of later arms do not fit beside it: none is kept for them
    reading: int = 0  # the predicted peak of reading the gate's fp32 references, before any arm (0: none)

    @property
    def peak(self) -> int:
        return max([*self.peaks, self.reading])

    def text(self) -> str:
        head = f"memory: predicted peak {gb(self.peak)} of {gb(self.budget)} ({self.source})"
        if self.reading:
            head += f"; reading the quantization gate's fp32 reference {gb(self.reading)}, before the arms"
        if len(self.groups) == 1:
            return head
        parts = [f"{i + 1}: {', '.join(c.name for c in g)} ({gb(p)})" for i, (g, p) in
                 enumerate(zip(self.groups, self.peaks))]
        return f"{head}; the arms do not fit together: {len(self.groups)} groups, each interleaved on its own, " \
               f"the anchor's copies their A/A arms: " + "; ".join(parts)


def _anchor(configs: list[BenchConfig], costs: dict[str, ArmCost]) -> BenchConfig | None:
    """The arm that runs in every group: the cheapest in-process `ar` arm (pairing reads its copies as its A/A
    twins), else the cheapest in-process arm."""
    inproc = [c for c in configs if c.backend == "inprocess"]
    pool = [c for c in inproc if c.strategy == "ar"] or inproc
    return min(pool, key=lambda c: costs[c.name].alone()) if pool else None


def plan(configs: list[BenchConfig], keys_of: KeysOf, questions: list[Question], *, interleaved: bool,
         limit: tuple[int, str] | None = None, base: int | None = None,
         reference_of: ReferenceOf | None = None, in_flight: int | None = None) -> MemoryPlan:
    """The run's groups (interleaved: as few as fit; otherwise one arm at a time) with their predicted peaks; raises
    BadInput naming the arm and the bytes where one does not fit alone. `configs` may hold the copies an earlier
    plan of this run added (a resumed run): they are placed again, not added twice."""
    budget_b, source = limit or budget()
    base = process_rss() if base is None else base
    refs = {r for c in configs if reference_of is not None and (r := reference_of(c)) is not None}
    kept = sum(logprob_bytes(r) for r in refs)
    reading = max((base + kept + int(reading_bytes(r) * HEADROOM) for r in refs), default=0)
    if reading > budget_b:
        names = ", ".join(c.name for c in configs if reference_of is not None and reference_of(c) is not None)
        raise BadInput(f"memory: reading the quantization gate's fp32 reference (for {names}) needs {gb(reading)}, more "
                       f"than the {gb(budget_b)} this run may use ({source}); turn the gate off (gates: "
                       f"{{quantization: false}}) or set {ENV}")
    base += kept
    own = [c for c in configs if GROUP_TAG not in c.name]
    copies = {c.name: c for c in configs if GROUP_TAG in c.name}
    max_tokens = max((c.max_tokens for c in configs), default=0)
    models = {k[0] for c in configs if c.backend == "inprocess" for k in keys_of(c).values()}
    context = {m: context_tokens(questions, max_tokens, _tokenizer(m)) for m in sorted(models)}
    costs = {c.name: arm_cost(c, keys_of, max((context[k[0]] for k in keys_of(c).values()), default=0)
                              if c.backend == "inprocess" else 0, in_flight) for c in configs}
    for c in own:
        if group_bytes([costs[c.name]], base) > budget_b:
            raise BadInput(f"memory: arm {c.name!r} alone needs {gb(group_bytes([costs[c.name]], base))} "
                           f"({gb(sum(costs[c.name].weights.values()))} of weights), more than the "
                           f"{gb(budget_b)} this run may use ({source}); run it on a bigger host, at a smaller "
                           f"precision, or set {ENV}")
    together = group_bytes(costs.values(), base)
    if not interleaved:  # one arm at a time; lean: none kept for a later arm (it is loaded again)
        return MemoryPlan(budget_b, source, [[c] for c in configs],
                          [group_bytes([costs[c.name]], base) for c in configs], lean=together > budget_b,
                          reading=reading)
    if together <= budget_b or len(own) == 1:
        return MemoryPlan(budget_b, source, [list(configs)], [together], reading=reading)
    anchor = _anchor(own, costs)
    lead = [anchor] if anchor is not None else []
    rest: list[list[BenchConfig]] = []  # each group's arms besides the anchor
    for c in own:
        if c is anchor:
            continue
        sizes = [(group_bytes([costs[x.name] for x in lead + g], base),
                  group_bytes([costs[x.name] for x in lead + g + [c]], base)) for g in rest]
        fits = [(after - before, i) for i, (before, after) in enumerate(sizes) if after <= budget_b]
        if fits:  # the group it adds least to (the weights it shares)
            rest[min(fits)[1]].append(c)
            continue
        need = group_bytes([costs[x.name] for x in lead + [c]], base)
        if need > budget_b:
            raise BadInput(f"memory: arm {c.name!r} beside the anchor arm {lead[0].name!r} needs {gb(need)}, more "
                           f"than the {gb(budget_b)} this run may use ({source}); set {ENV} higher or run the arms "
                           "in separate runs")
        rest.append([c])
    groups, added = [lead + rest[0]], []
    for k, g in enumerate(rest[1:], start=2):
        if anchor is None:
            groups.append(g)
            continue
        name = f"{anchor.name}{GROUP_TAG}{k}"
        copy = copies.get(name) or anchor.model_copy(update={"name": name})
        costs[name] = costs[anchor.name]
        groups.append([copy, *g])
        if name not in copies:
            added.append(copy)
    peaks = [group_bytes([costs[c.name] for c in g], base) for g in groups]
    return MemoryPlan(budget_b, source, groups, peaks, added, reading=reading)


def drift_text(configs: list[ConfigResult]) -> str | None:
    """The drift between memory groups, as the anchor's copies measured it: each copy's TPOT p50 over the anchor's at
    every level both ran (None: no copies in the run)."""
    by_name = {c.name: c for c in configs}
    parts = []
    for c in configs:
        anchor = by_name.get(c.name.split(GROUP_TAG)[0]) if GROUP_TAG in c.name else None
        if anchor is None:
            continue
        mine = {lr.load: lr.aggregate.tpot.p50 for lr in anchor.loads}
        for lr in c.loads:
            a, b = mine.get(lr.load), lr.aggregate.tpot.p50
            if a and b:
                parts.append(f"{c.name} {lr.load} {1000 * b:.1f} ms against {anchor.name}'s {1000 * a:.1f} ms "
                             f"({b / a:.2f}x)")
    return "drift between memory groups, TPOT p50: " + "; ".join(parts) if parts else None
