"""Helpers the tests share: fake backends and servers, a tiny varied model, a server run in a thread."""
