"""The server's Prometheus metrics, named like vLLM's with a `specledger:` prefix.

The harness scrapes /metrics before and after a load level and reads the deltas the same way it
reads a vLLM server's (bench/telemetry.py). Counters get Prometheus' `_total` suffix on export.

- `specledger:requests_total{endpoint, status}`: every request to a /v1 generation endpoint by
  outcome: the HTTP status ("200", "400", "404", "500", "503"), "500" also for an internal error
  after a stream had started, and "cancelled" when the client went away before the end.
- `specledger:request_success_total{finished_reason}`: completed generations ("stop" | "length").
- `specledger:prompt_tokens_total`, `specledger:generation_tokens_total`: tokens of every request
  the engine worked on (cancelled ones included, up to where they stopped).
- `specledger:prefix_cache_queries_total`, `specledger:prefix_cache_hits_total` (as vLLM's): prompt tokens of
  finished requests looked up in the prefix cache, and of those, found cached (not prefilled again).
- `specledger:time_to_first_token_seconds`: request received -> first token available (queue
  wait, tokenization and every prefill included); `specledger:e2e_request_latency_seconds`:
  request received -> last token; `specledger:request_queue_time_seconds`: waiting for the engine.
- `specledger:num_requests_running`, `specledger:num_requests_waiting` (gauges: sequences in the batch,
  requests queued for it), `specledger:batch_size` and `specledger:batch_rows` (sequences and rows in
  the engine's latest pass, 0 when idle; 1 or 0 without batching).
- `specledger:spec_decode_num_drafts_total{level}` (target verification steps that level took
  part in), `..._num_draft_tokens_total{level}` (tokens it proposed),
  `..._num_accepted_tokens_total{level}` (of those, accepted by the level above), per drafting
  level of the strategy (e.g. "lookup"; "draft"; the tree and chain levels of a hierarchy).
  For a single-level strategy, tau = 1 + accepted / drafts.
- `specledger:draft_failures_total`: failures in the batch's draft planning (the draft policy's sizing or learning,
  the drafter's proposals); each degrades its pass to no drafting (decoding/loop/speculation.py), the requests go on.
- `specledger:read_timeouts_total`, `specledger:connections_refused_total`: connections closed because a request's
  head and body did not arrive within `--read-timeout`, and connections over `--max-connections` answered 503
  (server/connections.py).
- `process_resident_memory_bytes` and the other standard process metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from specledger.decoding.loop.scheduler import GenerationResult

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)


class ServerMetrics:
    """One registry per server (tests run several servers in one process)."""

    def __init__(self, level_names: list[str]) -> None:
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        self.requests = Counter("specledger:requests", "Requests by endpoint and outcome", ["endpoint", "status"],
                                registry=r)
        self.success = Counter("specledger:request_success", "Completed generations by finish reason",
                               ["finished_reason"], registry=r)
        self.prompt_tokens = Counter("specledger:prompt_tokens", "Prompt tokens prefilled", registry=r)
        self.cache_queries = Counter("specledger:prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                     registry=r)
        self.cache_hits = Counter("specledger:prefix_cache_hits", "Prompt tokens found in the prefix cache", registry=r)
        self.generation_tokens = Counter("specledger:generation_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram("specledger:time_to_first_token_seconds", "Request received -> first token",
                              buckets=TTFT_BUCKETS, registry=r)
        self.e2e = Histogram("specledger:e2e_request_latency_seconds", "Request received -> last token",
                             buckets=E2E_BUCKETS, registry=r)
        self.queue_time = Histogram("specledger:request_queue_time_seconds", "Time waiting for the engine",
                                    buckets=E2E_BUCKETS, registry=r)
        self.running = Gauge("specledger:num_requests_running", "Requests being generated", registry=r)
        self.waiting = Gauge("specledger:num_requests_waiting", "Requests queued for the engine", registry=r)
        self.batch_size = Gauge("specledger:batch_size", "Sequences in the engine's latest pass (0 when idle)",
                                registry=r)
        self.batch_rows = Gauge("specledger:batch_rows", "Rows (tokens) in the engine's latest pass (0 when idle)",
                                registry=r)
        self.drafts = Counter("specledger:spec_decode_num_drafts", "Verification steps that carried a draft, per drafting level",
                              ["level"], registry=r)
        self.draft_tokens = Counter("specledger:spec_decode_num_draft_tokens", "Draft tokens proposed per level",
                                    ["level"], registry=r)
        self.accepted_tokens = Counter("specledger:spec_decode_num_accepted_tokens",
                                       "Draft tokens accepted per level", ["level"], registry=r)
        self.accepted_per_pos = Counter("specledger:spec_decode_num_accepted_tokens_per_pos",
                                        "Draft tokens accepted per level and draft position (0 = first)",
                                        ["level", "position"], registry=r)
        self.read_timeouts = Counter("specledger:read_timeouts", "Connections closed: a request's head and body did "
                                     "not arrive within the read timeout", registry=r)
        self.connections_refused = Counter("specledger:connections_refused", "Connections over the connection cap, "
                                           "answered 503", registry=r)
        self.draft_failures = _Read("specledger:draft_failures", "Passes whose draft planning failed (run without "
                                    "drafts) and draft-policy updates skipped", registry=r)
        for name in level_names:  # present from the first scrape, so before/after deltas work
            for c in (self.drafts, self.draft_tokens, self.accepted_tokens):
                c.labels(level=name)

    def request(self, endpoint: str, status: str | int) -> None:
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()

    def tokens(self, prompt: int, generated: int) -> None:
        self.prompt_tokens.inc(prompt)
        self.generation_tokens.inc(generated)

    def finished(self, result: GenerationResult) -> None:
        self.success.labels(finished_reason=result.finish_reason).inc()
        self.cache_queries.inc(result.prompt_tokens)
        self.cache_hits.inc(result.cached_tokens)
        for lv in result.levels:
            self.drafts.labels(level=lv.name).inc(lv.drafts or 0)
            self.draft_tokens.labels(level=lv.name).inc(lv.proposed)
            self.accepted_tokens.labels(level=lv.name).inc(lv.accepted)
            for pos, n in enumerate(lv.accepted_per_position):
                self.accepted_per_pos.labels(level=lv.name, position=str(pos)).inc(n)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Read(Collector):
    """A counter kept elsewhere (the engine's, read at each scrape: the engine thread never touches the registry)."""

    def __init__(self, name: str, doc: str, registry: CollectorRegistry) -> None:
        self.name, self.doc = name, doc
        self.read: Callable[[], int] = lambda: 0
        registry.register(self)

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self.name, self.doc, value=self.read())
