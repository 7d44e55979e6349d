"""A server on 127.0.0.1 in a background thread of the test process: the real uvicorn Server, bound first."""

from __future__ import annotations

import signal
import threading
import time

from fastapi import FastAPI

from specledger.errors import SpecLedgerError
from specledger.server.app import Server, bind


class ServerThread:
    """The server of `app` on a free port while the `with` block runs."""

    def __init__(self, app: FastAPI, *, host: str = "127.0.0.1", port: int = 0, shutdown_timeout_s: float = 10.0,
                 log_level: str = "warning") -> None:
        self.sock = bind(host, port)
        self.host, self.port = host, self.sock.getsockname()[1]
        self.server = Server(app, shutdown_timeout_s=shutdown_timeout_s, log_level=log_level, access_log=False)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise SpecLedgerError("the server did not start")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.handle_exit(signal.SIGTERM, None)  # what SIGTERM does
        self.thread.join(timeout)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
