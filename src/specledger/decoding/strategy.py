"""What names a decoding strategy: its target, its parameters, the drafter it decodes with (`batch_drafter`: None
for autoregressive decoding) and how its drafts are sized (`draft_length`); every strategy runs on the scheduler
(scheduler.py), alone (generate()) or in a batch, so all are run, measured and compared the same way.
"""

from __future__ import annotations

from specledger.decoding.drafters.base import Drafter
from specledger.decoding.params import check_draft_length
from specledger.engine.loader import LoadedModel


class Strategy:
    """Subclasses set `name` and `level_names` (their drafting levels, lowest first) and give `batch_drafter`."""

    name = "base"
    level_names: list[str] = []

    def __init__(self, target: LoadedModel, draft_length: str = "adaptive") -> None:
        self.target = target
        self.draft_length = check_draft_length(draft_length)  # how a batch sizes its drafts (sizing/policy.py)

    def params(self) -> dict:
        return {}

    def batch_drafter(self, n_slots: int) -> Drafter | None:
        """The strategy's drafter for the scheduler (None: autoregressive), following up to n_slots sequences."""
        raise NotImplementedError
