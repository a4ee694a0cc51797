"""Token usage as models report it: per model call, per turn, per conversation.

A model that reports usage puts it on the assistant message of that call
(:attr:`convoq.messages.Message.usage`), so it is stored with the turn on every backend and
survives the step journal and continuations. A turn's usage is the sum over the messages it
added (:func:`turn_usage`); a conversation's, the sum over its turns (kept as counters on
Redis, see :data:`COUNTER_FIELDS`). A server that reports nothing leaves ``usage`` unset and
every sum simply counts less: nothing breaks.

Token counts for windows (a token budget over stored turns): :func:`turn_tokens` is what
the Redis store writes as ``"tokens"`` into each turn element
(``{"blobs", "messages", "tokens"}``); it is derived from the usage on the turn's messages,
so memory backends without such a field compute the same number from the messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, NonNegativeInt


class Usage(BaseModel):
    """Tokens counted by the model, summed over ``requests`` model calls.

    ``cached_tokens`` are part of ``prompt_tokens`` (served from the provider's prompt
    cache) and ``reasoning_tokens`` part of ``completion_tokens`` (hidden reasoning), as the
    OpenAI API reports them.
    """

    # A value (a sum makes a new one): stored messages share theirs (convoq.messages).
    model_config = ConfigDict(frozen=True)
    requests: NonNegativeInt = 0
    prompt_tokens: NonNegativeInt = 0
    completion_tokens: NonNegativeInt = 0
    total_tokens: NonNegativeInt = 0
    cached_tokens: NonNegativeInt = 0
    reasoning_tokens: NonNegativeInt = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(**{name: getattr(self, name) + getattr(other, name) for name in FIELDS})

    @property
    def reported(self) -> bool:
        """Whether any token was counted at all."""
        return any(getattr(self, name) for name in FIELDS if name != "requests")


FIELDS: tuple[str, ...] = tuple(Usage.model_fields)


class _Counted(Protocol):
    """A message as seen here (this module sits below :mod:`convoq.messages`)."""

    @property
    def usage(self) -> Usage | None: ...


class _Named(_Counted, Protocol):
    """A message that may name the model that wrote it."""

    @property
    def model(self) -> str | None: ...


COUNTER_FIELDS: dict[str, str] = {name: f"usage_{name}" for name in FIELDS}
"""Usage field -> the Redis meta hash field that sums it over a conversation's turns."""

MODEL_COUNTER_PREFIX = "model_usage:"
"""Per model, the meta hash sums each usage field in ``model_usage:{model}:{field}`` (a
model name may hold colons; the field is what follows the last one)."""


def sum_usage(usages: Iterable[Usage | None]) -> Usage:
    """The sum of the usages given (``None`` ones count nothing)."""
    total = Usage()
    for usage in usages:
        if usage is not None:
            total = total + usage
    return total


def turn_usage(messages: Iterable[_Counted], *, requests: int | None = None) -> Usage:
    """The usage of a turn: the sum over ``messages`` (what the turn added after its user
    message). ``requests``: the model calls the turn made, when known (calls whose server
    reported no usage are counted there too)."""
    total = sum_usage(m.usage for m in messages)
    if requests is not None:
        total = total.model_copy(update={"requests": max(requests, total.requests)})
    return total


def children_usage(children: Iterable[Mapping[str, Any]]) -> Usage:
    """The usage of a turn's child turns (sub-agent calls): the sum of each one's
    ``"usage"`` (a child's own includes its children's)."""
    return sum_usage(
        Usage.model_validate(child["usage"])
        for child in children
        if isinstance(child.get("usage"), dict)
    )


def turn_tokens(turn: Sequence[_Counted]) -> int | None:
    """Tokens the model counted for what a stored turn added after its user message
    (assistant replies, tool calls, tool results), or None when its calls reported none.

    Within one turn the instructions and the history sent are the same on every call, so
    the last call's prompt minus the first call's prompt is exactly what the turn added
    before its final answer, and the final answer is the last call's completion (less its
    reasoning, which is never sent again). The user message itself is not included: a
    token budget counts it with an estimate (or a tokenizer) on top of this number.
    """
    counted = [m.usage for m in turn[1:] if m.usage is not None and m.usage.reported]
    if not counted:
        return None
    first, last = counted[0], counted[-1]
    added = max(0, last.prompt_tokens - first.prompt_tokens)
    return added + max(0, last.completion_tokens - last.reasoning_tokens)


def counters_to_usage(values: Mapping[str, Any]) -> Usage:
    """A :class:`Usage` from meta hash counters (missing ones are 0)."""
    out: dict[str, int] = {}
    for name, field in COUNTER_FIELDS.items():
        raw = values.get(field)
        if isinstance(raw, bytes):
            raw = raw.decode("ascii", "replace")
        try:
            out[name] = max(0, int(raw)) if raw is not None else 0
        except (TypeError, ValueError):
            out[name] = 0
    return Usage(**out)


def usage_by_model(messages: Iterable[_Named]) -> dict[str, Usage]:
    """Model name -> the usage of its calls among ``messages`` (each assistant message
    that names its model and reported usage; the others count nowhere here)."""
    found: dict[str, Usage] = {}
    for message in messages:
        if message.model is not None and message.usage is not None:
            found[message.model] = found.get(message.model, Usage()) + message.usage
    return found


def model_counters(by_model: Mapping[str, Usage]) -> dict[str, int]:
    """The meta hash counters that add ``by_model`` (only the fields above zero)."""
    out: dict[str, int] = {}
    for model, usage in by_model.items():
        for name, count in usage.model_dump().items():
            if count:
                out[f"{MODEL_COUNTER_PREFIX}{model}:{name}"] = count
    return out


def counters_by_model(values: Mapping[Any, Any]) -> dict[str, Usage]:
    """Model name -> :class:`Usage` from a meta hash's per-model counters (other fields,
    and values that are no count, are left out)."""
    raw: dict[str, dict[str, int]] = {}
    for key, value in values.items():
        field = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
        if not field.startswith(MODEL_COUNTER_PREFIX):
            continue
        model, _, name = field[len(MODEL_COUNTER_PREFIX) :].rpartition(":")
        try:
            count = int(value)
        except (TypeError, ValueError):
            continue
        if model and name in FIELDS and count > 0:
            raw.setdefault(model, {})[name] = count
    return {model: Usage(**fields) for model, fields in sorted(raw.items())}
