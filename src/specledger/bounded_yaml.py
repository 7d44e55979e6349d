"""YAML (and text) files read within bounds: their size, how deep they nest, what their aliases expand to.

A hand-written file (a run configuration, cost inputs) is a page of settings; a hostile or broken one is refused in
one line before it costs memory or a traceback: "billion laughs" (9 aliases of 9 aliases ...: 10^9 values from
a kilobyte) ran a reader that followed every alias until it was killed, and 50,000 nested brackets overflowed the
composer's recursion. libyaml is used where installed (the pure-Python reader takes seconds for thousands of lines).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from specledger.errors import BadInput

MAX_CHARS = 1 << 20
MAX_DEPTH = 32  # mappings and lists inside each other
MAX_VALUES = 200_000  # values once every alias is expanded

Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_text(path: Path, what: str, max_chars: int = MAX_CHARS) -> str:
    """A file's text: one line for a binary file (undecodable or holding NUL bytes) or one larger than max_chars
    (read no further than that)."""
    with path.open("rb") as f:
        data = f.read(4 * max_chars + 1)  # (UTF-8: at most 4 bytes a character)
    try:
        text = data.decode("utf-8-sig")
        if "\x00" in text:
            raise ValueError("a NUL byte")
    except ValueError:
        raise BadInput(f"{path}: not a text file ({what} are YAML)") from None
    if len(text) > max_chars:
        raise BadInput(f"{path}: more than {max_chars:,} characters; {what} are a page of YAML")
    return text


def compose(text: str, source: str, what: str, *, max_chars: int = MAX_CHARS, max_depth: int = MAX_DEPTH,
            max_values: int = MAX_VALUES) -> yaml.Node | None:
    """The text's YAML node graph: refused before composing when it nests deeper than max_depth (read on the event
    stream, which does not recurse) and after, when its aliases expand past max_values."""
    if len(text) > max_chars:
        raise BadInput(f"{source}: {len(text):,} characters; {what} are at most {max_chars:,}")
    try:
        depth = 0
        for event in yaml.parse(text, Loader=Loader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > max_depth:
                    raise BadInput(f"{source}:{event.start_mark.line + 1}: nested more than {max_depth} deep; "
                                   f"{what} are sections of fields")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        root = yaml.compose(text, Loader=Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise BadInput(f"{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:  # the values under a node, each alias counted as what it expands to
        if id(node) not in sizes:
            kids = [v for kv in node.value for v in kv] if isinstance(node, yaml.MappingNode) else \
                node.value if isinstance(node, yaml.SequenceNode) else []
            sizes[id(node)] = min(1 + sum(size(k) for k in kids), max_values + 1)
        return sizes[id(node)]

    if root is not None and size(root) > max_values:
        raise BadInput(f"{source}: its aliases (*name) expand to more than {max_values:,} values; refused "
                       "unread (a YAML alias bomb?)")
    return root


def construct(text: str, root: yaml.Node | None) -> Any:
    """The Python value of a composed document (aliases shared, not copied)."""
    return Loader(text).construct_document(root) if root is not None else None


def load(text: str, source: str, what: str) -> Any:
    """yaml.safe_load within the bounds above."""
    return construct(text, compose(text, source, what))
