"""The backend interface: one chat turn in, tokens with their arrival times out."""

from __future__ import annotations

from abc import ABC, abstractmethod

from pydantic import Field

from specledger.records.config import BenchConfig, Sampling
from specledger.records.results import RequestOutcome


class Completion(RequestOutcome):
    """One request as a backend saw it. Times are time.perf_counter() values."""

    ok: bool
    start: float  # sent (HTTP) or taken off the queue (in-process)
    end: float
    text: str = ""
    chunks: list[tuple[float, int]] = Field(default_factory=list)  # (arrival, tokens) per chunk/step
    first_token: float | None = None
    token_ids: list[int] | None = None


class Backend(ABC):
    """Runs turns of a conversation. `serial` backends serve one request at a time."""

    serial: bool = False

    def __init__(self, config: BenchConfig):
        self.config = config

    @abstractmethod
    async def start(self) -> None:
        """Load models / check the server is reachable. Raises SpecLedgerError when it cannot."""

    @abstractmethod
    async def complete(self, messages: list[dict[str, str]], *, max_tokens: int,
                       min_tokens: int | None = None, sampling: Sampling | None = None) -> Completion:
        """Answer the last user message of `messages`. Failures come back as ok=False, never raise. `sampling`:
        this request's instead of the configuration's (a retry loop's later attempts)."""

    async def close(self) -> None:
        return None

    def describe(self) -> str:
        """Backend and version, recorded in the run's conditions."""
        return self.config.backend

    async def verify_curve(self) -> list[dict[str, float]] | None:
        """[{tokens, ms}]: the target's forward time for n new tokens, where the backend can measure it."""
        return None

    def template_tokens(self) -> int | None:
        """Tokens the prompt format adds around one user message (its chat template), where known; 0: the text
        goes raw. A trace sizes whole prompts, so its filler is trimmed by them."""
        return None

    async def scrape_metrics(self) -> str | None:
        """Prometheus text of the server, where there is one."""
        return None

    async def gone(self) -> str | None:
        """Why the server behind this backend is no longer there (it refuses connections, its process exited), or
        None while it is: asked after a request failed at the connection, so that a dead server stops the level
        rather than being recorded as a level of failed requests."""
        return None

