"""Connections against slow and numerous clients: a time limit on reading a request, a cap on open connections.

uvicorn (0.55, h11) times out only idle keep-alive connections: one that sends its head a line every few seconds is
held for ever, and once the process runs out of file descriptors new clients are not accepted at all (left waiting,
never answered). Its `limit_concurrency` answers 503 only after a request's head has arrived, and counts the slow
connections against the limit. So the server runs uvicorn's H11Protocol with two additions (Config(http=...)):

- read_timeout_s: a request's head and body must arrive within this many seconds of its first byte (of the
  connection, for its first request). If not, the connection is answered 408 (when nothing was answered yet) and
  closed; the application sees the client go away.
- max_connections: a connection beyond the cap is answered 503 (`too_many_connections`, Retry-After) at once,
  without reading its request, and closed. The default stays below the process's descriptor limit (RLIMIT_NOFILE),
  so a refusal always has a descriptor to be written on.

Both count per process, not per client: a proxy in front should still bound connections and request rates per client
address (README).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, Callable

from uvicorn.protocols.http.h11_impl import H11Protocol

from specledger.server.schemas import error_body

log = logging.getLogger("specledger.server")

READ_TIMEOUT_S = 30.0
MAX_CONNECTIONS = 1024
RESERVED_FDS = 64  # the process's own files (model, libraries, logs, pipes)
LINGER_S = 1.0  # a refused connection is read (and dropped) this long, so the client reads its 503 before the close;
# at most max_connections of them linger (more are closed once written): admitted and lingering ones together stay
# within 2 x max_connections, so the default cap leaves the process its descriptors


def default_max_connections() -> int:
    """MAX_CONNECTIONS, or half of what the descriptor limit leaves (the other half: refusals being written)."""
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return MAX_CONNECTIONS
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(1, min(MAX_CONNECTIONS, (soft - RESERVED_FDS) // 2))


def descriptor_limit() -> int | None:
    """The process's soft RLIMIT_NOFILE (None: unlimited or unknown)."""
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else soft


@dataclass
class ConnectionLimits:
    read_timeout_s: float = READ_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS
    on_timeout: Callable[[], None] | None = None  # counted in the server's metrics
    on_refused: Callable[[], None] | None = None


def _response(status: str, message: str, type: str, code: str, extra: str = "") -> bytes:
    body = json.dumps(error_body(message, type, None, code)).encode()
    head = (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n{extra}"
            "connection: close\r\n\r\n")
    return head.encode() + body


def guarded_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol with the read timeout and the connection cap (module docstring); one class per
    server: it keeps that server's admitted connections."""
    timeout_reply = _response("408 Request Timeout", f"the request did not arrive within {limits.read_timeout_s:g} s "
                              "(--read-timeout)", "invalid_request_error", "request_timeout")
    refusal = _response("503 Service Unavailable", f"the server has {limits.max_connections} connections open, its "
                        "most (--max-connections); retry later", "server_overloaded", "too_many_connections",
                        "retry-after: 1\r\n")
    admitted: set[H11Protocol] = set()
    lingering: set[H11Protocol] = set()
    seen = {"timeouts": 0, "refused": 0}

    def count(kind: str, hook: Callable[[], None] | None, message: str, *args: Any) -> None:
        """One more of a kind: the server's metric, and a log line for the 1st, 2nd, 4th, 8th ... (a flood of them
        would otherwise flood the log)."""
        seen[kind] += 1
        if hook is not None:
            hook()
        n = seen[kind]
        if n & (n - 1) == 0:
            log.warning(message + "; %d so far", *args, n)

    class GuardedH11Protocol(H11Protocol):
        _timer: asyncio.TimerHandle | None = None
        _refused = False
        _before: Any = None  # the request cycle when the timer was armed (a new one: the request's head arrived)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(admitted) >= limits.max_connections:
                self._refuse()
                return
            admitted.add(self)
            self._arm()

        def _refuse(self) -> None:
            self._refused = True
            count("refused", limits.on_refused, "refused a connection: %d open, the most (--max-connections)",
                  limits.max_connections)
            self.transport.write(refusal)
            if len(lingering) >= limits.max_connections or not self.transport.can_write_eof():
                self.transport.close()  # (after the 503 is written)
                return
            self.transport.write_eof()
            lingering.add(self)
            self._timer = self.loop.call_later(LINGER_S, self.transport.close)  # (or at the client's close: uvicorn
            # closes on end of input)

        def _arm(self) -> None:
            self._before = self.cycle
            self._timer = self.loop.call_later(limits.read_timeout_s, self._timed_out)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _timed_out(self) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            count("timeouts", limits.on_timeout, "closed a connection: its request did not arrive within %g s "
                  "(--read-timeout)", limits.read_timeout_s)
            current = self.cycle if self.cycle is not self._before else None
            if current is None or not current.response_started:
                self.transport.write(timeout_reply)
            self.transport.close()  # (uvicorn tells a running application that the client went away)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return  # read and dropped: closing with unread data would reset the connection before the 503 is read
            if self._timer is None and (self.cycle is None or self.cycle.response_complete):
                self._arm()  # the first byte of the next request on a kept-alive connection
            super().data_received(data)
            if self._timer is not None and self.cycle is not self._before and not self.cycle.more_body:
                self._disarm()  # the request's head and body are in

        def connection_lost(self, exc: Exception | None) -> None:
            admitted.discard(self)
            lingering.discard(self)
            self._disarm()
            super().connection_lost(exc)

    return GuardedH11Protocol
