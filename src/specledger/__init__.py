"""specledger: cost per accepted task for each decoding configuration, measured side by side."""

__version__ = "0.1.0"
