"""The OpenAI HTTP backend on a server specledger starts for the configuration and stops afterwards."""

from __future__ import annotations

import re
from pathlib import Path

from specledger.bench.backends.base import Backend, Completion
from specledger.bench.config import BenchConfig
from specledger.bench.managed import ManagedServer


class ManagedOpenAIBackend(Backend):
    """start(): launch the configured server and wait for its health; then the plain OpenAI backend on its URL.
    close(): close the client, stop the server. The server's log is `server-<config>.log` in the run directory."""

    def __init__(self, config: BenchConfig, *, log_dir: str | Path):
        super().__init__(config)
        assert config.openai is not None and config.openai.server is not None
        s = config.openai.server
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", config.name)
        self.server = ManagedServer(s.command, model=config.model, log_path=Path(log_dir) / f"server-{safe}.log",
                                    host=s.host, port=s.port, health=s.health, startup_timeout_s=s.startup_timeout_s,
                                    stop_grace_s=s.stop_grace_s, env=s.env, name=config.name,
                                    draft_model=s.draft_model)
        self.inner: Backend | None = None

    async def start(self) -> None:
        from specledger.bench.backends.openai_http import OpenAIBackend

        url = await self.server.start_async()
        assert self.config.openai is not None
        live = self.config.model_copy(update={"openai": self.config.openai.model_copy(update={"base_url": url})})
        self.inner = OpenAIBackend(live)
        self.serial = self.inner.serial
        try:
            await self.inner.start()
        except BaseException:
            await self.close()
            raise

    async def complete(self, messages: list[dict[str, str]], *, max_tokens: int,
                       min_tokens: int | None = None) -> Completion:
        assert self.inner is not None, "start() first"
        return await self.inner.complete(messages, max_tokens=max_tokens, min_tokens=min_tokens)

    async def close(self) -> None:
        try:
            if self.inner is not None:
                await self.inner.close()
        finally:
            self.inner = None
            self.server.stop()

    def describe(self) -> str:
        inner = self.inner.describe() if self.inner is not None else ""
        return f"managed `{' '.join(self.server.argv)}`; {inner}".strip()

    async def verify_curve(self) -> list[dict[str, float]] | None:
        return await self.inner.verify_curve() if self.inner is not None else None

    async def scrape_metrics(self) -> str | None:
        return await self.inner.scrape_metrics() if self.inner is not None else None
