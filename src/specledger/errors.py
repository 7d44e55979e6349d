"""One exception type for every user-facing failure.

The CLI turns it into a one-line message and a non-zero exit, never a traceback.
"""


class SpecLedgerError(Exception):
    """A problem the user can fix: bad input, a missing model, an impossible option."""


class ModelNotFound(SpecLedgerError):
    pass


class UnsupportedModel(SpecLedgerError):
    pass


class BadInput(SpecLedgerError):
    pass
