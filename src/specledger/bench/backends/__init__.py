"""Backends run one request (one turn) and report when each token arrived."""

from specledger.bench.backends.base import Backend, Completion
from specledger.bench.backends.make import make_backend

__all__ = ["Backend", "Completion", "make_backend"]
