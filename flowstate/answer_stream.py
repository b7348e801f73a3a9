"""The final answer's text, picked out of a model output while it is decoded, for token streaming.

The answer is the JSON string in the last block, ``<assistant_message>{"content": "…"}``. The
block's opening is recognised by the literal that precedes it in every protocol —
``\\n</tool_calls>\\n<assistant_message>\\n`` with real newlines, which no JSON string can hold
unescaped — so text inside earlier blocks never passes for the answer. The string's escapes are
undone as they complete; ``emit`` receives the answer's text piece by piece, exactly as the
parsed output will hold it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

MARK = "\n</tool_calls>\n<assistant_message>\n"
_OPEN = re.compile(r'\s*\{\s*"content"\s*:\s*')
_SIMPLE = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class AnswerStream:
    """Feed it the raw output as it is decoded; it emits the final answer's text (nothing for a null answer)."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self.emit = emit
        self._buf = ""
        self._pos = 0
        self._state = "seek"  # seek -> open -> text -> done
        self.sent: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self.sent)

    def feed(self, piece: str) -> None:
        self._buf += piece
        if self._state == "seek":
            at = self._buf.find(MARK)
            if at < 0:
                return
            self._state, self._pos = "open", at + len(MARK)
        if self._state == "open":
            opened = _OPEN.match(self._buf, self._pos)
            if opened is None or opened.end() >= len(self._buf):
                return
            self._pos = opened.end()
            self._state = "text" if self._buf[self._pos] == '"' else "done"  # null: no answer in this output
            self._pos += 1
        if self._state == "text":
            self._text()

    def _text(self) -> None:
        out: list[str] = []
        buf, i = self._buf, self._pos
        while i < len(buf):
            c = buf[i]
            if c == '"':
                self._state = "done"
                i += 1
                break
            if c != "\\":
                out.append(c)
                i += 1
                continue
            if i + 1 >= len(buf):
                break  # the escape is not complete yet
            kind = buf[i + 1]
            if kind in _SIMPLE:
                out.append(_SIMPLE[kind])
                i += 2
                continue
            if kind != "u" or i + 6 > len(buf):
                break
            code = int(buf[i + 2:i + 6], 16)
            if 0xD800 <= code < 0xDC00:  # a surrogate pair: wait for its second half
                if i + 12 > len(buf):
                    break
                low = int(buf[i + 8:i + 12], 16)
                out.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
                i += 12
            else:
                out.append(chr(code))
                i += 6
        self._pos = i
        if out:
            text = "".join(out)
            self.sent.append(text)
            self.emit(text)
