"""The stream's text: whole UTF-8 characters only, no part of a stop string, adds up to the final text."""

from __future__ import annotations

from specledger.cli.server import parse_params
from specledger.server.textstream import TextStream


class ByteTokenizer:
    """Each token id is one byte: decoding is UTF-8 with replacement, like a byte-level BPE vocabulary."""

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    @staticmethod
    def ids(text: str) -> list[int]:
        return list(text.encode("utf-8"))


def stream(text: str, stops: list[str], step: int = 1) -> tuple[list[str], TextStream]:
    tok = ByteTokenizer()
    ts = TextStream(tok, stops)
    ids = tok.ids(text)
    pieces = [ts.push(ids[i:i + step]) for i in range(0, len(ids), step)]
    return pieces, ts


def test_multibyte_characters_are_never_split():
    pieces, ts = stream("né 日本", [])
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == "né 日本"
    assert pieces[1] == "" and pieces[2] == "é"  # "é" is two bytes: nothing until both are in


def test_stop_string_spanning_tokens_never_leaks():
    text = "one two STOP three"
    pieces, ts = stream(text, ["STOP"])
    sent = "".join(pieces)
    assert sent == "one two "
    assert "S" not in sent and ts.stopped
    assert ts.push(ByteTokenizer.ids(" more")) == ""
    # generate() cuts its own text at the stop: the stream adds nothing beyond it
    assert ts.finish("one two ") == ""


def test_stop_prefix_is_held_then_released():
    pieces, ts = stream("a STa STO", ["STOP"])
    assert "".join(pieces) == "a STa "  # "STO" could still become STOP: held
    assert ts.push(ByteTokenizer.ids("q")) == "STOq"  # it did not
    assert not ts.stopped and ts.finish("a STa STOq!") == "!"


def test_several_stops_earliest_wins_and_finish_completes_the_text():
    pieces, ts = stream("x\n\nyz END", ["END", "\n\n"], step=3)
    assert "".join(pieces) == "x"
    pieces, ts = stream("héllo wor", ["zz"], step=2)
    assert "".join(pieces) + ts.finish("héllo world") == "héllo world"


def test_strategy_params_parse_types():
    assert parse_params(["num_tokens=8", "p=0.5", "flag=true", "head=path/x.pt"]) == {
        "num_tokens": 8, "p": 0.5, "flag": True, "head": "path/x.pt"}
    import pytest

    from specledger.errors import BadInput

    with pytest.raises(BadInput, match="key=value"):
        parse_params(["novalue"])
