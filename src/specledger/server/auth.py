"""API keys for `specledger serve`: which keys, where they come from, and the check on every request.

Keys come from --api-key (repeatable), --api-key-file (one per line; blank lines and lines starting
with # are skipped) and the SPECLEDGER_API_KEY environment variable; any of them opens the door.
Requests to /v1/* (and /metrics when it is closed) without `Authorization: Bearer <key>` matching
one of them get 401 in the OpenAI error shape. Keys are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from specledger.errors import BadInput
from specledger.server.schemas import send_error

ENV_VAR = "SPECLEDGER_API_KEY"

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable, Callable], Awaitable[None]]


def collect_keys(flags: list[str], key_file: Path | None, environ: dict[str, str] | None = None) -> list[str]:
    """Every accepted key: flags, then the file's lines, then the environment variable."""
    env = os.environ if environ is None else environ
    keys = [k.strip() for k in flags]
    if any(not k for k in keys):
        raise BadInput("--api-key is empty; give the key itself, e.g. --api-key $(cat key.txt)")
    if key_file is not None:
        try:
            lines = Path(key_file).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise BadInput(f"--api-key-file {key_file}: cannot read it ({exc.strerror or exc})") from None
        file_keys = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
        if not file_keys:
            raise BadInput(f"--api-key-file {key_file}: no key in it (one key per line)")
        keys += file_keys
    if env.get(ENV_VAR, "").strip():
        keys.append(env[ENV_VAR].strip())
    for k in keys:
        if any(ch.isspace() for ch in k) or not k.isprintable():
            raise BadInput("an API key contains whitespace or control characters; keys are single printable tokens")
    return list(dict.fromkeys(keys))


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or "localhost": only this machine can connect."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, keys: list[str]) -> str | None:
    """A one-line warning when the server listens beyond this machine with no key, else None."""
    if keys or is_loopback(host):
        return None
    return (f"warning: listening on {host} without an API key: anyone who can reach this port can use the "
            f"server (set --api-key, --api-key-file or {ENV_VAR})")


def key_matches(header: bytes | None, keys: list[bytes]) -> bool:
    """The raw `Authorization: Bearer <key>` header against every key, each compared in constant time."""
    if not header:
        return False
    scheme, _, given = header.partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    token = given.strip()
    found = False
    for k in keys:  # no early exit: the time does not depend on which key matched
        found |= hmac.compare_digest(token, k)
    return found


class ApiKeyMiddleware:
    """ASGI middleware: refuses protected paths without a valid key before anything else runs (body
    parsing included), and passes every other request through untouched (streams, disconnects)."""

    def __init__(self, app: ASGIApp, *, keys: list[str], protect_metrics: bool = False,
                 on_refused: Callable[[str], None] | None = None) -> None:
        self.app = app
        self.keys = [k.encode("utf-8") for k in keys]
        self.protect_metrics = protect_metrics
        self.on_refused = on_refused

    def protected(self, path: str) -> bool:
        return path == "/v1" or path.startswith("/v1/") or (self.protect_metrics and path == "/metrics")

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or not self.keys or not self.protected(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope.get("headers", []) if k == b"authorization"), None)
        if key_matches(header, self.keys):
            await self.app(scope, receive, send)
            return
        if self.on_refused is not None:
            self.on_refused(scope["path"])
        if header:
            message, code = "incorrect API key provided", "invalid_api_key"
        else:
            message, code = "missing API key: send it as the header 'Authorization: Bearer <key>'", "missing_api_key"
        await send_error(send, 401, message, code, (b"www-authenticate", b"Bearer"))
