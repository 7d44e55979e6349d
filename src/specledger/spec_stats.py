"""Speculation statistics: one shape from the decoding step to the report.

A drafting level proposes tokens to the level above it, which keeps a prefix (a chain) or a path (a
tree). It is counted the way vLLM's SpecDecodingStats and llama.cpp's `spec_decode` counters count it:
verification steps at the level, the steps that carried a draft, draft tokens proposed and accepted, and
accepted tokens per draft position (the depth of a tree node). A generation result, the server's
`specledger` field and `/metrics`, the HTTP telemetry parser, the results on disk and the report all hold
this one type. Torch-free: the harness and the report import it without the engine.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, computed_field


class LevelStats(BaseModel):
    """One drafting level over a request, a load level or a server's window."""

    model_config = ConfigDict(extra="ignore")

    name: str
    proposed: int = 0  # draft tokens proposed to the level above
    accepted: int = 0  # of which it accepted
    steps: int | None = None  # verification steps at this level (None: the source does not say)
    drafts: int | None = None  # of which carried at least one draft token
    accepted_per_position: list[int] = Field(default_factory=list)  # [i]: steps that accepted draft position i
    time_s: float | None = None  # time spent drafting at this level

    @computed_field  # type: ignore[prop-decorator]
    @property
    def rate(self) -> float | None:
        """Acceptance rate: accepted / proposed draft tokens."""
        return self.accepted / self.proposed if self.proposed else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def position_rates(self) -> list[float]:
        """How often draft position i was accepted, per step that carried a draft."""
        return [a / self.drafts for a in self.accepted_per_position] if self.drafts else []

    def observe(self, proposed: int, accepted: int, time_s: float = 0.0) -> None:
        """One verification step at this level: `proposed` tokens drafted, the first `accepted` positions kept."""
        self.steps = (self.steps or 0) + 1
        self.drafts = (self.drafts or 0) + (1 if proposed else 0)
        self.proposed += proposed
        self.accepted += accepted
        if accepted > len(self.accepted_per_position):
            self.accepted_per_position.extend([0] * (accepted - len(self.accepted_per_position)))
        for i in range(accepted):
            self.accepted_per_position[i] += 1
        if time_s:
            self.time_s = (self.time_s or 0.0) + time_s


def merge_levels(groups: Iterable[Iterable[LevelStats]]) -> list[LevelStats]:
    """Levels of many requests summed by name (first-seen order). A count some source left out (None) stays
    None in the sum, so a total never mixes requests that reported it with requests that did not (a partial
    sum of positions would understate); a level that proposed nothing adds nothing and leaves them as they are."""
    out: dict[str, LevelStats] = {}
    for levels in groups:
        for lv in levels:
            s = out.get(lv.name)
            if s is None:
                out[lv.name] = s = LevelStats(name=lv.name, steps=0, drafts=0)
            s.proposed += lv.proposed
            s.accepted += lv.accepted
            s.steps = None if s.steps is None or lv.steps is None else s.steps + lv.steps
            if lv.proposed and lv.drafts is None:
                s.drafts, s.accepted_per_position = None, []
            elif s.drafts is not None:
                s.drafts += lv.drafts or 0
                a, b = s.accepted_per_position, lv.accepted_per_position
                s.accepted_per_position = [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0)
                                           for i in range(max(len(a), len(b)))]
            if lv.time_s is not None:
                s.time_s = (s.time_s or 0.0) + lv.time_s
    return list(out.values())
