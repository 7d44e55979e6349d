"""Many sequences following their tokens in one slot cache: a model as the scheduler and its drafters run it.

Invariant, per sequence: its slot caches the first `cached` tokens of `tokens`; the rest (at least the last,
"pending" token) is fed with the next pass. Adopting a new sequence (`sync`) keeps the common cached prefix, which
is how a level resynchronises after a verification (O(1) rollback, no recomputation of what is still valid).

Prefix cache (optional, like llama-server's cache_prompt and vLLM's prefix caching): a closed
sequence's slot keeps its entries, and a new sequence takes the free slot whose kept tokens share
the longest prefix with its own, so the next turn of a conversation (or the same prompt again)
prefills only what is new. A slot whose kept tokens share nothing is taken least recently
freed first, so the freshest conversations stay cached longest. A slot's kept entries that a new sequence is about
to overwrite are parked first, copied to host memory (`park_bytes` at most, least recently parked dropped first,
like llama-server's --cache-ram), and a later prompt sharing more of its prefix with a parked copy than with any free
slot has it copied back instead of prefilled: the slots bound the requests in flight, not the prompts remembered
(S26: the pair recipe's c=4 level re-asked its c=1 prompts, 8 prompts through 4 slots, and prefilled every one).
One `forward` carries, for every sequence
in it, its uncached run (one pending token when decoding, a chunk of the prompt when
prefilling) and optionally a draft tree (a chain is a tree; an empty tree is a plain
decode step), so a verification pass holds every sequence's drafted rows at once and each
sequence is verified and accepted on its own afterwards (`accept`).

Features (optional, for a drafter that reads the target's features: EAGLE): each slot also keeps the
final-normed hidden state of every token it caches, so a prompt whose prefix came from the prefix
cache still has its whole prompt's features (`features`) although only its new tokens were fed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specledger.decoding.tree import Tree
from specledger.engine.loader import LoadedModel
from specledger.engine.model import new_slot_cache, ragged_hidden
from specledger.engine.ragged import Segment
from specledger.errors import BadInput


@dataclass
class Sequence:
    slot: int
    tokens: list[int]
    reused: int = 0  # tokens found cached when it was opened (the prefix cache)


SIMILAR = 0.5  # a kept prefix this share of the prompt takes its slot (llama-server's --slot-prompt-similarity)
PARK_BYTES = 128 << 20  # host memory for parked prefixes, per runner (the 1.5B: ~4,700 tokens; the 0.5B ~11,000)
PARK_MIN = 16  # kept prefixes shorter than this are not parked (a chat template's shared head)


@dataclass
class Parked:
    """A slot's kept entries copied to host memory: its tokens, their keys and values (layers, kv heads, n, head
    dim) and, where the runner keeps them, their features."""

    tokens: list[int]
    k: torch.Tensor
    v: torch.Tensor
    features: torch.Tensor | None

    @property
    def nbytes(self) -> int:
        ts = [self.k, self.v] + ([self.features] if self.features is not None else [])
        return sum(t.numel() * t.element_size() for t in ts)


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device="cpu").copy_(t)


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """How many leading tokens a and b share, at most `limit` (all of them, the usual case, in one comparison)."""
    n = min(len(a), len(b), limit)
    if a[:n] == b[:n]:
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class RunItem:
    """One sequence's part of a pass.

    max_run: feed at most this many uncached tokens (a prefill chunk). The tree hangs off
    the last token of the run, so it is only fed with the chunk that completes the run;
    a pass that leaves part of the run uncached gives that sequence no logits.
    """

    seq: Sequence
    tree: Tree | None = None
    max_run: int | None = None


@dataclass
class RunForward:
    """One item's share of a pass."""

    logits: torch.Tensor | None  # (1 + len(tree), V): at the run's last token and every node; None: part of a run
    hidden: torch.Tensor  # (n_run + len(tree), H): final-normed features of every token fed
    n_run: int  # sequence tokens fed before the tree


def tree_rows(start: int, n_run: int, tree: Tree, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions (n,) and mask (n, start + n) of a run followed by a tree hanging off its last token."""
    depths = torch.tensor(tree.depths())
    positions = torch.cat([torch.arange(start, start + n_run), start + n_run - 1 + depths])
    n = n_run + len(tree)
    mask = torch.zeros(n, start + n, dtype=torch.bool)
    mask[:, :start] = True
    mask[:n_run, start : start + n_run] = torch.ones(n_run, n_run, dtype=torch.bool).tril()
    mask[n_run:, start : start + n_run] = True
    mask[n_run:, start + n_run :] = tree.ancestor_mask()
    return positions.to(device), mask.to(device)


class ModelRunner:
    def __init__(self, lm: LoadedModel, n_slots: int, max_len: int | None = None, *,
                 prefix_cache: bool = False, keep_features: bool = False, park_bytes: int = PARK_BYTES) -> None:
        self.lm = lm
        self.model = lm.model
        self.max_len = min(max_len or lm.config.max_seq_len, lm.config.max_seq_len)
        self.cache = new_slot_cache(lm.model, n_slots, self.max_len)
        self.prefix_cache = prefix_cache
        self._kept: dict[int, list[int]] = {}  # free slot -> the tokens its entries hold
        self._freed: dict[int, int] = {}  # free slot -> when it was freed (a count of closes)
        self._closes = 0
        self.keep_features = keep_features
        self._feats: dict[int, torch.Tensor] = {}  # slot -> (capacity, H) features of its cached entries
        self.park_bytes = park_bytes if prefix_cache else 0
        self._parked: list[Parked] = []  # least recently parked first
        self.restored = 0  # prompts whose prefix came back from a parked copy (a count, for tests and stats)
        self.device = lm.model.device  # (read several times a step: the module's property costs ~3 us a read)

    def open(self, tokens: list[int]) -> Sequence:
        """A new sequence in a free slot, nothing cached yet (its first pass is its prefill)."""
        if len(tokens) > self.max_len:
            raise BadInput(f"prompt of {len(tokens)} tokens exceeds the context of {self.max_len} tokens")
        slot, keep = self._reusable(tokens) if self.prefix_cache else (None, 0)
        best, shared = self._best_parked(tokens, keep)
        parked = None if best is None else self._parked.pop(best)  # before parking the slot may drop it
        if slot is not None and self.park_bytes:
            self._park(slot, keep)
        slot = self.cache.alloc(slot, keep)
        self._kept.pop(slot, None)
        if parked is not None:
            self._restore(slot, parked, shared)
            keep = shared
        return Sequence(slot, list(tokens), keep)

    def _park(self, slot: int, keep: int) -> None:
        """Copy the free slot's kept entries to host memory before a sequence reusing only `keep` of them
        overwrites the rest."""
        kept = self._kept.get(slot, [])
        n = len(kept)
        if n <= keep or n < PARK_MIN:
            return
        k, v = self.cache.k[:, slot, :, :n], self.cache.v[:, slot, :, :n]
        feats = self._feats.get(slot) if self.keep_features else None
        if self.keep_features and (feats is None or feats.shape[0] < n):
            return
        p = Parked(list(kept), _host_copy(k), _host_copy(v), None if feats is None else _host_copy(feats[:n]))
        if p.nbytes > self.park_bytes:
            return
        self._parked.append(p)
        total = sum(x.nbytes for x in self._parked)
        while total > self.park_bytes:
            total -= self._parked.pop(0).nbytes

    def _best_parked(self, tokens: list[int], keep: int) -> tuple[int | None, int]:
        """The parked copy sharing the longest prefix with `tokens` (its index, the prefix's length), where it is
        longer than `keep` (what a free slot gives) and covers SIMILAR of the prompt; the latest parked on a tie."""
        if not self._parked:
            return None, 0
        lcp = [common_prefix(p.tokens, tokens, len(tokens) - 1) for p in self._parked]
        best = max(range(len(lcp)), key=lambda i: (lcp[i], i))
        return (best, lcp[best]) if lcp[best] > keep and lcp[best] >= SIMILAR * len(tokens) else (None, 0)

    def _restore(self, slot: int, p: Parked, n: int) -> None:
        """Copy the first `n` entries of a parked prefix back into the slot just opened."""
        self.cache.reserve(n)
        self.cache.k[:, slot, :, :n].copy_(p.k[:, :, :n])
        self.cache.v[:, slot, :, :n].copy_(p.v[:, :, :n])
        self.cache.lengths[slot] = n
        if p.features is not None:
            self._store(slot, 0, p.features[:n].to(self.device))
        self.restored += 1

    def _reusable(self, tokens: list[int]) -> tuple[int | None, int]:
        """The free slot to open `tokens` in and how many of its kept entries they reuse: the longest common
        prefix (short of the last token, whose logits the first pass needs) where it covers SIMILAR of the
        prompt, else the slot freed longest ago (never used first), so that a chat template's few shared tokens
        do not evict another conversation (8 prompts in turn through one slot each evicting the last: session 17)."""
        free = self.cache.free
        if not free:
            return None, 0
        lcp = {s: common_prefix(self._kept.get(s, []), tokens, len(tokens) - 1) for s in free}
        slot = max(free, key=lambda s: (lcp[s], -self._freed.get(s, -1)))
        if lcp[slot] < SIMILAR * len(tokens):
            slot = max(free, key=lambda s: -self._freed.get(s, -1))
        return slot, lcp[slot]

    def close(self, seq: Sequence, *, keep: bool = True) -> None:
        """Free the sequence's slot; with the prefix cache its entries stay for a later sequence, unless not
        `keep` (a failed pass may have left them half written)."""
        if self.prefix_cache and keep:
            self._kept[seq.slot] = seq.tokens[: self.cached(seq)]
            self._freed[seq.slot] = self._closes
            self._closes += 1
        else:
            self._kept.pop(seq.slot, None)
        self.cache.release(seq.slot)

    def cached(self, seq: Sequence) -> int:
        return self.cache.lengths[seq.slot]

    def features(self, seq: Sequence) -> torch.Tensor:
        """The features of every token the sequence's slot caches, reused prefix included (keep_features)."""
        if not self.keep_features:
            raise ValueError("this runner keeps no features (keep_features=False)")
        n = self.cached(seq)
        buf = self._feats.get(seq.slot)
        if buf is None:
            if n:
                raise ValueError(f"slot {seq.slot} caches {n} tokens but holds no features")
            return torch.zeros(0, self.lm.config.hidden_size, device=self.device)
        return buf[:n]

    def _store(self, slot: int, start: int, rows: torch.Tensor) -> None:
        """Features of the slot's entries start.. (grown by doubling; what lies past the cache length is stale)."""
        end = start + rows.shape[0]
        buf = self._feats.get(slot)
        if buf is None or end > buf.shape[0]:
            grown = rows.new_zeros(min(self.max_len, max(end, 64, 2 * (0 if buf is None else buf.shape[0]))),
                                   rows.shape[1])
            if buf is not None:
                grown[: buf.shape[0]] = buf
            buf = self._feats[slot] = grown
        buf[start:end] = rows

    def sync(self, seq: Sequence, tokens: list[int]) -> None:
        """Adopt a new token sequence, keeping the cached prefix it shares with the old one."""
        self.cache.rollback(seq.slot, common_prefix(seq.tokens, tokens, min(self.cached(seq), len(tokens) - 1)))
        seq.tokens = list(tokens)

    def room(self, seq: Sequence) -> int:
        """Tokens that can still be drafted on top of the sequence."""
        return self.max_len - len(seq.tokens)

    def forward(self, items: list[RunItem], *, all_logits: bool = False) -> list[RunForward]:
        """One pass over every item; per item a RunForward whose logits are at the run's last token and
        every tree node (None when the item fed only part of its run), and hidden of every row fed."""
        toks: list[int] = []
        pos: list[torch.Tensor] = []
        segs: list[Segment] = []
        plan: list[tuple[int, int, bool]] = []  # (n_run, n_tree, run complete) per item
        starts: list[int] = []
        dev = self.device
        for it in items:
            seq, start = it.seq, self.cached(it.seq)
            starts.append(start)
            pending = len(seq.tokens) - start
            n_run = pending if it.max_run is None else min(pending, it.max_run)
            done = n_run == pending
            tree = it.tree if done and it.tree else None
            n_tree = len(tree) if tree else 0
            if n_run < 1:
                raise ValueError(f"slot {seq.slot}: nothing to feed (every token is cached)")
            if start + n_run + n_tree > self.max_len:
                raise BadInput(f"draft of {n_tree} tokens does not fit the remaining context "
                               f"({self.max_len - start - n_run})")
            toks.extend(seq.tokens[start : start + n_run])
            if tree:
                toks.extend(tree.tokens)
            if tree is None or tree.is_chain():
                pos.append(torch.arange(start, start + n_run + n_tree, device=dev))
                segs.append(Segment(seq.slot, n_run + n_tree))
            else:
                p, m = tree_rows(start, n_run, tree, dev)
                pos.append(p)
                segs.append(Segment(seq.slot, n_run + n_tree, m))
            plan.append((n_run, n_tree, done))
        h = ragged_hidden(self.model, torch.tensor(toks, device=dev), torch.cat(pos), segs, self.cache)
        if self.keep_features:  # the run is cached now; a tree's kept path is stored by accept
            off = 0
            for it, start, (n_run, n_tree, _) in zip(items, starts, plan):
                self._store(it.seq.slot, start, h[off : off + n_run])
                off += n_run + n_tree
        # the LM head once, over the rows whose logits someone needs
        rows: list[int] = []
        off = 0
        for n_run, n_tree, done in plan:
            if all_logits:
                rows.extend(range(off, off + n_run + n_tree))
            elif done:
                rows.extend(range(off + n_run - 1, off + n_run + n_tree))
            off += n_run + n_tree
        logits: torch.Tensor | None = None
        if rows and len(rows) == h.shape[0]:  # every row (a decode step): no gather
            logits = self.model.logits(h)
        elif rows:
            logits = self.model.logits(h[torch.tensor(rows, device=dev)])
        out: list[RunForward] = []
        off = r = 0
        for n_run, n_tree, done in plan:
            n = n_run + n_tree
            k = n if all_logits else (1 + n_tree if done else 0)
            # k > 0 only when rows is not empty, so logits exists then
            out.append(RunForward(logits[r : r + k] if k and logits is not None else None, h[off : off + n], n_run))
            off += n
            r += k
        return out

    def accept(self, seq: Sequence, fwd: RunForward, path: list[int], new_tokens: list[int]) -> torch.Tensor:
        """Keep the run and the accepted path in the slot; append the emitted tokens.

        Returns the features of the tokens now newly cached (the run, then the path).
        """
        n_tree = fwd.hidden.shape[0] - fwd.n_run
        tree_start = self.cached(seq) - n_tree
        seq.tokens.extend(new_tokens)
        if not n_tree:  # a plain decode step: its run is cached already, nothing to move or gather
            return fwd.hidden
        self.cache.keep(seq.slot, tree_start, [tree_start + i for i in path])
        if self.keep_features and path:
            self._store(seq.slot, tree_start, fwd.hidden[[fwd.n_run + i for i in path]])
        rows = list(range(fwd.n_run)) + [fwd.n_run + i for i in path]
        return fwd.hidden[rows]
