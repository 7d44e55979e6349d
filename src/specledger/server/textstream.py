"""Token ids in, streamable text out: never half a UTF-8 character, never any part of a stop string.

Decoding each new token on its own is wrong for byte-level vocabularies (a character may span
tokens) and for SentencePiece ones (a leading space depends on what precedes). So new tokens are
decoded together with the previous settled tokens as context, and only the difference is kept.
Text is settled once it no longer ends in U+FFFD (an incomplete character). Settled text that
could be the beginning of a stop string is held back until it is clear it is not; once a stop
string appears, nothing from it onwards is ever sent. At the end, `finish(final_text)` returns
whatever of generate()'s own text has not been sent, so a stream always adds up to that text.
"""

from __future__ import annotations

import logging

log = logging.getLogger("specledger.server")


class TextStream:
    def __init__(self, tokenizer, stops: list[str]) -> None:
        self.tok = tokenizer
        self.stops = [s for s in stops if s]
        self.ids: list[int] = []
        self.text = ""  # decoded text of ids[:mark]
        self.sent = 0  # characters of self.text already handed out
        self.stopped = False
        self._ctx = 0  # ids[ctx:mark] are decoded again as context for new tokens
        self._mark = 0

    def push(self, ids: list[int]) -> str:
        """Add tokens; return the text that is now safe to send (possibly empty)."""
        self.ids.extend(ids)
        if self.stopped:
            return ""
        head = self.tok.decode(self.ids[self._ctx:self._mark]) if self._mark > self._ctx else ""
        full = self.tok.decode(self.ids[self._ctx:])
        piece = full[len(head):]
        if piece and not piece.endswith("\ufffd"):
            self.text += piece
            self._ctx, self._mark = self._mark, len(self.ids)
        return self._release()

    def _release(self) -> str:
        end = len(self.text)
        longest = max((len(s) for s in self.stops), default=0)
        if longest:
            start = max(0, self.sent - longest + 1)
            hits = [i for s in self.stops if (i := self.text.find(s, start)) >= 0]
            if hits:
                self.stopped = True
                end = min(hits)
            else:
                end -= _held_back(self.text, self.stops)
        end = max(end, self.sent)
        out = self.text[self.sent:end]
        self.sent = end
        return out

    def finish(self, final_text: str) -> str:
        """What remains of the request's final text after everything already sent."""
        sent = self.text[:self.sent]
        if final_text.startswith(sent):
            return final_text[len(sent):]
        log.warning("streamed text diverged from the final text after %d characters", self.sent)
        return ""


def _held_back(text: str, stops: list[str]) -> int:
    """Length of the longest end of `text` that is the beginning of some stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best
