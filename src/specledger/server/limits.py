"""A bound on request bodies, enforced before they are parsed: one huge body must not hold the event loop.

The Content-Length header is checked before a byte of the body is read; a body without one (chunked)
is counted as it arrives and refused once past the bound, so at most the bound (plus one chunk) is ever
held. A refused request is answered 413 at once and its connection closed (the rest is never read).
A body within the bound is handed on to the application as it came.
"""

from __future__ import annotations

from typing import Any, Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specledger.server.schemas import send_error


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, *, max_bytes: int, on_refused: Callable[[str], None] | None = None) -> None:
        self.app, self.max_bytes, self.on_refused = app, max_bytes, on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, send, f"{declared} bytes")
            return
        chunks: list[bytes] = []
        size = 0
        while True:  # read it here, bounded, then replay it to the application
            message = await receive()
            if message["type"] != "http.request":  # the client went away mid-body: nobody to answer
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, send, f"more than {self.max_bytes} bytes")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay(body, receive), send)

    async def _refuse(self, scope: Scope, send: Send, got: str) -> None:
        if self.on_refused is not None:
            self.on_refused(scope.get("path", ""))
        msg = (f"the request body is too large ({got}); this server takes at most {self.max_bytes} bytes "
               "(--max-body-bytes)")
        await send_error(send, 413, msg, "request_too_large", (b"connection", b"close"))


def _content_length(scope: Scope) -> int | None:
    raw = next((v for k, v in scope.get("headers", []) if k == b"content-length"), None)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None  # the server's HTTP parser refuses a malformed length itself


def _replay(body: Message, receive: Receive) -> Callable[[], Any]:
    """A receive() that hands out the body already read, then defers to the real one (disconnects)."""
    pending = [body]

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
