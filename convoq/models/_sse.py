"""Server-sent events, line by line: the framing the Responses and Anthropic streams share.

An event is its ``event:`` name and its ``data:`` lines joined by newlines, complete at the
blank line that ends it; ``:`` comments (keep-alives) and ``id:``/``retry:`` fields are
skipped. A line that is none of these is refused: the stream is not what it claims to be.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from convoq.errors import ModelError

_EXCERPT = 200


@dataclass
class SSEBuffer:
    """Collects the lines of one event at a time."""

    _event: str = ""
    _data: list[str] = field(default_factory=list)

    def feed(self, line: str) -> tuple[str, str] | None:
        """Take one line; return ``(event name, data)`` when it completes an event."""
        if not line:
            return self.flush()
        if line.startswith(":") or line.startswith(("id:", "retry:")):
            return None
        if line.startswith("event:"):
            self._event = line[6:].strip()
            return None
        if line.startswith("data:"):
            self._data.append(line[5:].removeprefix(" "))
            return None
        raise ModelError(f"the model stream sent a line that is not SSE: {excerpt(line)}")

    def flush(self) -> tuple[str, str] | None:
        """The event collected so far (a stream may end without its last blank line)."""
        if not self._data:
            self._event = ""
            return None
        event = (self._event, "\n".join(self._data))
        self._event, self._data = "", []
        return event


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
