"""Server-sent events, read as the WHATWG HTML standard says ("Interpreting an event
stream"): the one reader of every model stream (Chat Completions, Responses, Anthropic).

- The body is UTF-8 (whatever the Content-Type says); one leading byte order mark is
  dropped. Lines end with CRLF, LF or CR, nothing else: a ``U+2028`` inside a JSON
  string is data, not a line break (:func:`lines`, not httpx's ``aiter_lines``).
- ``field:value`` lines, with one space after the colon dropped; a line without a colon is
  a field with an empty value; a line starting with ``:`` is a comment (keep-alives).
- ``data`` lines of one event are joined with newlines; ``event`` names it (``message``
  when it does not); ``id`` sets the last event id (unless it holds a NUL) and ``retry``
  the reconnection time (digits only). Any other field is ignored, as the standard says:
  a proxy that adds one does not break the stream.
- A blank line ends the event; an event with no ``data`` line is not dispatched.

One tolerance beyond the standard: a stream that ends without the blank line after its
last event (or without the line end of its last line) still yields that event. Model
streams carry their own end marker (``[DONE]``, ``message_stop``, ``response.completed``),
so an answer cut off is caught by it, not by the framing.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from convoq.errors import ModelError

_EXCERPT = 200
_LINE_END = re.compile(r"\r\n|\r|\n")
_BOM = "\ufeff"


@dataclass(frozen=True)
class Event:
    """One dispatched event: its type, data, the last event id and the retry time (ms)."""

    event: str = "message"
    data: str = ""
    id: str = ""
    retry: int | None = None


class LineSplitter:
    """Bytes in, lines out: UTF-8 decoded incrementally (invalid bytes replaced), the
    leading BOM dropped, lines split at CRLF, LF or CR only (a CRLF split between two
    chunks is one line end)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._tail = ""
        self._after_cr = False
        self._started = False

    def feed(self, chunk: bytes) -> list[str]:
        """The lines ``chunk`` completes."""
        return self._split(self._decoder.decode(chunk))

    def end(self) -> list[str]:
        """The last line, when the body did not end with a line end."""
        lines = self._split(self._decoder.decode(b"", final=True))
        tail, self._tail = self._tail, ""
        return [*lines, tail] if tail else lines

    def _split(self, text: str) -> list[str]:
        if not text:  # nothing decoded yet (a character split between chunks)
            return []
        if not self._started:
            self._started = True
            text = text.removeprefix(_BOM)
        if self._after_cr and text.startswith("\n"):
            text = text[1:]  # the LF of a CRLF whose CR ended the previous chunk
        self._after_cr = text.endswith("\r")
        parts = _LINE_END.split(self._tail + text)
        self._tail = parts.pop()
        return parts


async def lines(chunks: AsyncIterable[bytes]) -> AsyncIterator[str]:
    """The lines of an event stream body (see :class:`LineSplitter`)."""
    splitter = LineSplitter()
    async for chunk in chunks:
        for line in splitter.feed(chunk):
            yield line
    for line in splitter.end():
        yield line


def iter_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """:func:`lines` for a blocking body."""
    splitter = LineSplitter()
    for chunk in chunks:
        yield from splitter.feed(chunk)
    yield from splitter.end()


@dataclass
class SSEBuffer:
    """Collects the fields of one event at a time (the standard's buffers)."""

    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _last_id: str = ""
    _retry: int | None = None

    def feed(self, line: str) -> Event | None:
        """Take one line (without its line end); return the event a blank line ends."""
        if not line:
            return self.flush()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self._retry = int(value)
        return None

    def flush(self) -> Event | None:
        """The event collected so far, if it has data (a stream may end without its last
        blank line); the event's name and data start afresh either way."""
        data, name = self._data, self._event
        self._data, self._event = [], ""
        if not data:
            return None
        return Event(name or "message", "\n".join(data), self._last_id, self._retry)


def event_object(data: str) -> dict[str, Any]:
    """The JSON object an event carries, or ModelError."""
    try:
        value = json.loads(data)
    except ValueError:
        raise ModelError(f"a model stream event is not JSON: {excerpt(data)}") from None
    if not isinstance(value, dict):
        raise ModelError(f"a model stream event is not a JSON object: {excerpt(data)}")
    return value


def excerpt(value: Any) -> str:
    """The start of ``value``, quoted, for an error message."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    text = value if isinstance(value, str) else repr(value)
    return repr(text[:_EXCERPT] + ("..." if len(text) > _EXCERPT else ""))
