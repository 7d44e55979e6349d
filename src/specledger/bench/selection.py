"""Choosing questions from a stream of them, without holding the file: filters, samples, limit.

Order of application: category/kind filter, then `per_category` (a seeded sample per category), then `sample`
(a seeded random sample of the whole stream), then `limit` (the first N). The result keeps the file's order.

- per_category: a counting pass, then `random.Random(f"{seed}/{category}").sample(range(n), k)` positions per
  category on a second pass: the same picks as sampling an in-memory list, independent of other categories,
  and only counts are held.
- sample: reservoir sampling (Algorithm R, seeded): one pass, at most `sample` questions held.
- limit alone stops reading once N questions are taken (and every named category has been seen).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from specledger.bench.formats.lines import BadLines
from specledger.records.question import Question
from specledger.errors import BadInput


@dataclass
class Selected:
    questions: list[Question]
    read: int  # valid questions read (on the final pass)
    complete: bool  # the stream was read to its end


def reservoir(items: Iterator, k: int, rng: random.Random) -> list:
    """A uniform sample of k items (all of them when fewer), in stream order; holds at most k."""
    kept: list[tuple[int, object]] = []
    for i, item in enumerate(items):
        if i < k:
            kept.append((i, item))
        else:
            j = rng.randrange(i + 1)
            if j < k:
                kept[j] = (i, item)
    return [item for _, item in sorted(kept, key=lambda p: p[0])]


def select(
    stream: Callable[[BadLines], Iterator[Question]],
    bad: BadLines,
    *,
    categories: list[str] | None = None,
    per_category: int | None = None,
    sample: int | None = None,
    limit: int | None = None,
    seed: int = 0,
) -> Selected:
    """Apply the selection to `stream(bad)` (called twice with per_category: once to count, quietly)."""
    wanted = {c.strip().lower() for c in categories} if categories else None
    names: dict[str, set[str]] = {"categories": set(), "kinds": set()}
    read = [0]

    def matching(items: Iterator[Question], count: bool) -> Iterator[Question]:
        for q in items:
            read[0] += count
            names["categories"].add(q.category)
            names["kinds"].add(q.kind)
            if wanted is None or q.category.lower() in wanted or q.kind in wanted:
                yield q

    def unknown() -> list[str]:
        return sorted(wanted - {c.lower() for c in names["categories"]} - names["kinds"]) if wanted else []

    items = matching(stream(bad), True)
    if per_category is not None:
        counts = Counter(q.category for q in matching(stream(BadLines(bad.policy, quiet=True)), False))
        picks = {cat: set(random.Random(f"{seed}/{cat}").sample(range(n), min(per_category, n)))
                 for cat, n in counts.items()}
        position: Counter = Counter()

        def picked(qs: Iterator[Question]) -> Iterator[Question]:
            for q in qs:
                i = position[q.category]
                position[q.category] += 1
                if i in picks.get(q.category, ()):
                    yield q

        items = picked(items)
    complete = True
    if sample is not None:
        out = reservoir(items, sample, random.Random(f"{seed}/sample"))
    elif limit is not None:
        out = []
        for q in items:
            if len(out) < limit:
                out.append(q)
            if len(out) >= limit and not unknown():  # past the limit only to check the named categories
                complete = False
                break
    else:
        out = list(items)
    if limit is not None:
        out = out[:limit]
    if wanted and (missing := unknown()):
        cats, kinds = sorted(names["categories"]), sorted(names["kinds"])
        raise BadInput(
            f"unknown workload categor{'y' if len(missing) == 1 else 'ies'} {', '.join(missing)}; "
            f"available categories: {', '.join(cats)}; kinds: {', '.join(kinds)}"
        )
    return Selected(questions=out, read=read[0], complete=complete)
