"""Counting tokens for a token-budget window, without a tokenizer by default.

A :class:`TokenCounter` counts the tokens of a run of messages: one stored turn (a user
message and what followed it) or the leading system/developer messages. The default,
:class:`RecordedTokenCounter`, uses what the model counted when the turn ran (the usage
recorded on the turn's assistant messages, :func:`convoq.usage.turn_tokens`) and an offline
estimate (:func:`estimate_tokens`) for the user message and for turns whose server reported
no usage. An exact tokenizer plugs in with :class:`TokenizerCounter`, e.g. tiktoken when its
encodings are available locally::

    enc = tiktoken.get_encoding("o200k_base")
    counter = TokenizerCounter(lambda text: len(enc.encode(text)))
    Agent(model, max_history_tokens=8000, token_counter=counter)

Estimates are deliberately rough (about four characters a token, a fixed cost per message,
per image and per kilobyte of a file): a budget is a bound on size, not a bill.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from convoq.messages import FilePart, ImagePart, Message, MessageRole, TextPart
from convoq.usage import turn_tokens

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD = 4
"""Tokens a chat message costs beyond its content (role and separators)."""
IMAGE_TOKENS = 765
"""A high-detail image of one 512 px tile on the OpenAI models, a common middle ground."""
FILE_BYTES_PER_TOKEN = 64
"""Files (PDFs) are sent as extracted text plus page images; their size is a rough guide."""


@runtime_checkable
class TokenCounter(Protocol):
    """Counts the tokens of a run of messages (a whole turn, or the leading messages)."""

    def count(self, messages: Sequence[Message]) -> int:
        """Tokens the messages take when sent to the model (>= 0)."""
        ...


def _text_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def estimate_tokens(
    messages: Sequence[Message], text_tokens: Callable[[str], int] = _text_tokens
) -> int:
    """An offline estimate of what ``messages`` cost; ``text_tokens`` counts one text."""
    total = 0
    for message in messages:
        total += MESSAGE_OVERHEAD
        for part in message.content:
            if isinstance(part, TextPart):
                total += text_tokens(part.text)
            elif isinstance(part, ImagePart):
                total += IMAGE_TOKENS
            elif isinstance(part, FilePart):
                total += MESSAGE_OVERHEAD + len(part.data) // FILE_BYTES_PER_TOKEN
        for call in message.tool_calls:
            total += MESSAGE_OVERHEAD + text_tokens(call.name)
            total += text_tokens(json.dumps(call.arguments, ensure_ascii=False))
    return total


class RecordedTokenCounter:
    """The default: a turn's recorded model counts where its calls reported usage, plus an
    estimate of its user message; an estimate of everything else."""

    def count(self, messages: Sequence[Message]) -> int:
        if messages and messages[0].role == MessageRole.USER:
            recorded = turn_tokens(messages)
            if recorded is not None:
                return estimate_tokens(messages[:1]) + recorded
        return estimate_tokens(messages)


class TokenizerCounter:
    """Counts text with a tokenizer: ``count_text(text) -> tokens`` (attachments and the
    per-message overhead are estimated as by the default counter).

    Args:
        count_text: e.g. ``lambda s: len(tiktoken_encoding.encode(s))``.
    """

    def __init__(self, count_text: Callable[[str], int]) -> None:
        self._count_text = count_text

    def count(self, messages: Sequence[Message]) -> int:
        return estimate_tokens(messages, self._count_text)


DEFAULT_COUNTER = RecordedTokenCounter()
"""The counter used when none is given; Redis stores its count in each turn's header."""
