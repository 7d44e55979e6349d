"""One exception type for every user-facing failure.

The CLI turns it into a one-line message and a non-zero exit, never a traceback.
"""

from pydantic import ValidationError


class SpecLedgerError(Exception):
    """A problem the user can fix: bad input, a missing model, an impossible option."""


class ModelNotFound(SpecLedgerError):
    pass


class UnsupportedModel(SpecLedgerError):
    pass


class BadInput(SpecLedgerError):
    pass


def describe(exc: ValidationError) -> str:
    """A pydantic error as the one line a BadInput says: the first problem, naming its field."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        return f"unknown field {loc!r}"
    if kind == "literal_error":
        return f"{loc}: {err['msg'].lower()} (got {err['input']!r})"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg
