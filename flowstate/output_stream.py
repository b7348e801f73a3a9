"""What a model output says, picked out while it is decoded, for token streaming: the final answer's
text (``AnswerStream``) and the tool calls with their arguments (``ToolCallStream``).

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


TOOLS_MARK = "\n<tool_calls>\n"
"""The tool_calls block's opening after an earlier block (real newlines: no JSON string holds them unescaped);
an output that starts with the block (full context's, or the lean protocol's without memory blocks) opens with
``TOOLS_OPEN``."""
TOOLS_OPEN = "<tool_calls>\n"
_NAME = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


class ToolCallStream:
    """Feed it the raw output as it is decoded; for each tool call it reports the call's position (1-based)
    and name once both are decoded, then the raw JSON text of its arguments piece by piece.

    The tool_calls block is recognised by the literal before it (real newlines, as for the answer); calls
    are read in the grammar's key order (``name``, then ``arguments``) — an output written otherwise is
    simply not streamed, and its calls arrive whole when the step ends.
    """

    def __init__(self, on_call: Callable[[int, str], None], on_arguments: Callable[[int, str], None]) -> None:
        self.on_call, self.on_arguments = on_call, on_arguments
        self._buf = ""
        self._pos = 0
        self._state = "seek"  # seek -> between -> head -> args -> between ... -> done
        self._position = 0
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def feed(self, piece: str) -> None:
        self._buf += piece
        while self._step():
            pass

    def _step(self) -> bool:
        """Advance as far as the text allows; True if the state changed (call again)."""
        handler = {"seek": self._seek, "between": self._between, "head": self._head, "args": self._args,
                   "close": self._close}.get(self._state)
        return handler() if handler is not None else False

    def _seek(self) -> bool:
        if self._buf.startswith(TOOLS_OPEN):
            self._state, self._pos = "between", len(TOOLS_OPEN)
            return True
        at = self._buf.find(TOOLS_MARK)
        if at < 0:
            return False
        self._state, self._pos = "between", at + len(TOOLS_MARK)
        return True

    def _skip(self, chars: str) -> bool:
        """Move past ``chars``; True if text remains after them."""
        while self._pos < len(self._buf) and self._buf[self._pos] in chars:
            self._pos += 1
        return self._pos < len(self._buf)

    def _between(self) -> bool:  # before '[' / ',' / the next '{' / ']'
        if not self._skip(" \n\t\r[,"):
            return False
        if self._buf[self._pos] == "{":
            self._state = "head"
            return True
        self._state = "done"  # ']' or anything unexpected
        return False

    def _head(self) -> bool:
        buf = self._buf
        head = _NAME.match(buf, self._pos)
        if head is None:
            at = buf.find('"arguments"', self._pos)
            rest = buf[at + len('"arguments"'):].lstrip(" \n\t\r:") if at >= 0 else ""
            if rest or len(buf) - self._pos > 400:
                self._state = "done"  # not the grammar's shape: leave it to the end of the step
            return False
        self._position += 1
        self.on_call(self._position, head.group(1))
        self._pos = head.end()
        self._state, self._depth, self._in_string, self._escaped = "args", 0, False, False
        return True

    def _args(self) -> bool:
        buf, start = self._buf, self._pos
        end = self._scan(start)
        stop = end if end is not None else len(buf)
        if stop > start:
            self.on_arguments(self._position, buf[start:stop])
        self._pos = stop
        if end is None:
            return False
        if not self._skip(" \n\t\r"):
            self._state = "close"
            return False
        self._pos += 1  # the call object's closing brace
        self._state = "between"
        return True

    def _scan(self, i: int) -> int | None:
        """Where the arguments object that continues at ``i`` ends (past its closing brace), or None."""
        buf = self._buf
        while i < len(buf):
            c = buf[i]
            i += 1
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i
        return None

    def _close(self) -> bool:
        if not self._skip(" \n\t\r"):
            return False
        self._pos += 1
        self._state = "between"
        return True
