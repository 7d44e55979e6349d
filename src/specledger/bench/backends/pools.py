"""Connections for streamed requests: one single-connection httpcore pool per request in flight, per replica,
checked out and back in. The requests go through httpcore (httpx's transport) directly: httpx's per-request
layers and a pool that scans every connection on each request cost more than the rest of the harness together.
"""

from __future__ import annotations

import socket
import ssl

import httpcore

# httpcore writes a request's headers and body in two sends: without TCP_NODELAY the body waits for the ACK of
# the headers (Nagle) while the server's kernel delays that ACK (~40 ms), capping each connection near 25 req/s.
_NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


class ConnectionPools:
    def __init__(self, replicas: int, keepalive_expiry_s: float) -> None:
        self.keepalive_expiry_s = keepalive_expiry_s
        self.free: list[list[httpcore.AsyncConnectionPool]] = [[] for _ in range(replicas)]  # idle, per replica
        self.all: list[httpcore.AsyncConnectionPool] = []
        self._ssl: ssl.SSLContext | None = None

    def ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:  # loading CA certificates takes ~40 ms: once, shared by every connection
            import certifi

            self._ssl = ssl.create_default_context(cafile=certifi.where())
        return self._ssl

    def checkout(self, replica: int, *, fresh: bool = False) -> httpcore.AsyncConnectionPool:
        """An idle connection to `replica`, or a new one (always new when `fresh`)."""
        free = self.free[replica]
        if free and not fresh:
            return free.pop()
        pool = httpcore.AsyncConnectionPool(ssl_context=self.ssl_context(), max_connections=1,
                                            keepalive_expiry=self.keepalive_expiry_s, socket_options=_NODELAY)
        self.all.append(pool)
        return pool

    async def checkin(self, pool: httpcore.AsyncConnectionPool, replica: int, *, keep: bool) -> None:
        """Back to the idle ones, or closed for good (`keep` False). One closed by close() meanwhile stays out."""
        if pool not in self.all:
            return
        if keep:
            self.free[replica].append(pool)  # a connection that failed is closed: the pool opens a new one
        else:
            self.all.remove(pool)
            await pool.aclose()

    async def close(self) -> None:
        for pool in self.all:
            await pool.aclose()
        self.all, self.free = [], [[] for _ in self.free]
