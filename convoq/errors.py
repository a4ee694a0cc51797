"""The errors convoq raises. Every one of them is a :class:`ConvoqError`.

::

    ConvoqError
    ├── InvalidMessageError            a message breaks a rule (the rule is named)
    ├── InvalidConversationIdError     an id that may not reach a key or a path
    ├── AttachmentError                a missing, empty, mistyped or oversize attachment
    ├── InvalidCallbackUrlError        a callback_url that is not an http(s) URL to a host
    ├── InvalidScheduleError           a scheduled turn's time (delay_s, not_before) is invalid
    ├── ConversationMemoryError        a memory backend could not load or store
    │   ├── ConversationBusyError      another turn of this conversation is running
    │   ├── UnsupportedFormatVersionError   stored data of a format we do not read
    │   ├── CorruptDataError           stored data that does not parse (the key is named)
    │   ├── MalformedReplyError        a Redis script answered an unreadable reply (named)
    │   └── SummaryConflictError       the history or summary changed while it was summarised
    ├── ModelError                     the model call failed or answered nonsense
    │   ├── ModelHTTPError             the model endpoint answered an HTTP error
    │   ├── ModelTimeoutError          the model call ran past its deadline
    │   ├── TruncatedAnswerError       the model stopped at its token limit (finish "length")
    │   └── OutputValidationError      the answer did not fit the output type, retries spent
    ├── InvalidModelSettingsError      model settings that cannot be sent (the field is named)
    ├── InvalidOutputTypeError         an output type that is no model, dataclass or schema
    ├── ToolError                      a tool is unknown or its arguments are invalid
    ├── ToolFailure                    raised by a tool: its message is what the model reads
    ├── MaxStepsExceededError          the model/tool loop did not finish in max_steps
    ├── GuardrailTripped               a guardrail tripped: the turn ended as blocked
    ├── ProtocolError                  a turn-protocol script refused a transition
    │   ├── StaleFenceError            the caller's lease was taken over
    │   ├── LeaseLostError             renewing the lease failed while a turn ran
    │   ├── NotInboxHeadError          the turn is not the one being run
    │   ├── TurnAlreadyAppliedError    the turn was already committed, failed or cancelled
    │   └── TurnNotRetryableError      only a failed turn can be retried
    ├── NotDurableError                fewer replicas than asked confirmed a write (retry it)
    ├── RedisUnavailableError          Redis cannot be reached or did not answer (it is named)
    ├── UnknownTurnError               no such turn (or it expired)
    ├── UnknownAgentError              no agent profile by that name
    ├── TurnFailedError                a queued turn failed; carries the remote error
    ├── TurnCancelledError             a queued turn was cancelled or discarded
    ├── TurnTimeoutError               a wait ran out before the turn finished
    ├── TurnDeadlineError              a turn ran longer than max_turn_s and was stopped
    ├── QueueFullError                 a queued-turn limit is reached; nothing was queued
    ├── SignalBacklogFullError         a conversation keeps the most signals of that name
    ├── IdempotencyKeyReusedError      an idempotency key sent again with another request
    └── ConfigurationError             settings that cannot work together

Errors that cross processes travel as data (``{type, message, details}``) in the turn
record; :meth:`ConvoqError.to_data` and :func:`error_from_data` convert both ways. Every
class also pickles with its fields (:meth:`ConvoqError.__reduce__`), for whoever sends
them through multiprocessing or a result backend.
"""

from __future__ import annotations

from typing import Any


class ConvoqError(Exception):
    """The root of every error convoq raises."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception pickles as cls(*args): subclasses whose __init__ takes keyword fields
        # (status_code=..., response=...) could not be rebuilt that way. Rebuild bare and
        # restore every attribute instead.
        return (_rebuild, (type(self), self.message), self.__dict__)

    def to_data(self) -> dict[str, Any]:
        """The JSON-safe form stored in a turn record."""
        return {"type": type(self).__name__, "message": self.message, "details": self.details}


class InvalidMessageError(ConvoqError):
    """A message breaks a rule; the message names the rule."""


class InvalidConversationIdError(ConvoqError):
    """A conversation or turn id that is not allowed to reach a key or a path."""


class AttachmentError(ConvoqError):
    """An attachment is missing, empty, of the wrong type or over the size limit."""


class InvalidCallbackUrlError(ConvoqError):
    """A ``callback_url`` that is not an absolute http(s) URL with a host, or too long."""


class InvalidScheduleError(ConvoqError):
    """A scheduled turn's ``delay_s`` or ``not_before`` is invalid, or cannot be kept."""


class ConversationMemoryError(ConvoqError):
    """A memory backend could not load or store a conversation."""

    def __init__(self, message: str, *, response: Any = None, **details: Any) -> None:
        super().__init__(message, **details)
        # When storing fails after the model answered, the answer is kept here.
        self.response = response


class ConversationBusyError(ConversationMemoryError):
    """Another turn of this conversation is running or awaiting approval (a memory error,
    as the memory guide has it)."""


class UnsupportedFormatVersionError(ConversationMemoryError):
    """Stored data has a format version this convoq does not read."""


class CorruptDataError(ConversationMemoryError):
    """Stored data does not parse; the key or path is named."""


class MalformedReplyError(ConversationMemoryError):
    """A Redis script answered a reply of another shape than it does (too short, too
    long, an item of the wrong type); ``details`` names the script and shows the reply."""


class SummaryConflictError(ConversationMemoryError):
    """A summary was refused: the history or the previous summary changed after it was
    read (nothing was written; compaction runs again later)."""


class ModelError(ConvoqError):
    """The model call failed or returned a response that cannot be used."""


class ModelHTTPError(ModelError):
    """The model endpoint answered with an HTTP error status."""

    def __init__(self, message: str, *, status_code: int, body: str = "") -> None:
        super().__init__(message, status_code=status_code, body=body[:2000])
        self.status_code = status_code
        self.body = body


class ModelTimeoutError(ModelError):
    """The model call (one attempt, or all of them with retries) ran past its deadline."""


class TruncatedAnswerError(ModelError):
    """The model stopped at its token limit (``finish_reason == "length"``): the answer is
    cut off, or there is none."""


class OutputValidationError(ModelError):
    """The model's final answer did not fit the turn's output type, also after
    ``output_retries`` retries with the errors; ``answer`` is its last answer as sent,
    ``errors`` what was wrong with it."""

    def __init__(
        self, message: str, *, answer: str = "", errors: list[str] | None = None, **details: Any
    ) -> None:
        super().__init__(message, answer=answer, errors=list(errors or []), **details)

    # Read from details, so the fields survive to_data()/error_from_data() and pickling
    # with nothing to restore.
    @property
    def answer(self) -> str:
        return str(self.details.get("answer", ""))

    @property
    def errors(self) -> list[str]:
        return [str(e) for e in self.details.get("errors") or []]


class InvalidModelSettingsError(ConvoqError):
    """Model settings that cannot be sent: an unknown field, a value out of range, a
    tool_choice naming no tool; ``field`` names it."""


class InvalidOutputTypeError(ConvoqError):
    """An output type that is not a pydantic model, a dataclass or an object JSON schema
    convoq can check."""


class ToolError(ConvoqError):
    """A tool is unknown or was called with invalid arguments."""


class ToolFailure(ConvoqError):
    """Raised by a tool to tell the model why the call failed: the message reaches the
    model as it is (no ``Error:`` prefix, no type name); the turn goes on."""


class MaxStepsExceededError(ConvoqError):
    """The model/tool loop did not reach a final answer within max_steps."""


class GuardrailTripped(ConvoqError):
    """A guardrail tripped: the turn ended with status ``blocked`` and stored nothing.
    ``guardrail`` names it, ``kind`` is ``"input"`` or ``"output"``, ``reason`` says why
    and ``info`` is what it reported besides (JSON)."""

    def __init__(
        self,
        message: str,
        *,
        guardrail: str = "",
        kind: str = "input",
        reason: str = "",
        info: Any = None,
        **details: Any,
    ) -> None:
        super().__init__(
            message, guardrail=guardrail, kind=kind, reason=reason, info=info, **details
        )

    # Read from details, so the fields survive to_data()/error_from_data() and pickling.
    @property
    def guardrail(self) -> str:
        return str(self.details.get("guardrail", ""))

    @property
    def kind(self) -> str:
        return str(self.details.get("kind", "input"))

    @property
    def reason(self) -> str:
        return str(self.details.get("reason", ""))

    @property
    def info(self) -> Any:
        return self.details.get("info")


class NotDurableError(ConvoqError):
    """A write reached the primary but fewer replicas than ``min_replicas_acked`` confirmed
    it in time: a failover may still lose it. Retry it (every write script is replay-safe);
    ``details`` has ``replicas`` (confirmed) and ``wanted``."""


class RedisUnavailableError(ConvoqError):
    """The Redis a client uses cannot be reached or did not answer in time (after the
    client's own reconnects); ``details["redis"]`` names it (its URL without the password,
    or the embedded server's directory). Nothing is known to have changed: retry once it
    answers."""


class ProtocolError(ConvoqError):
    """A turn-protocol script refused a state transition."""


class StaleFenceError(ProtocolError):
    """The caller's fence token is no longer current: another worker took the lease."""


class LeaseLostError(ProtocolError):
    """Renewing the lease failed: another worker owns the conversation now."""


class NotInboxHeadError(ProtocolError):
    """The turn is not at the head of the conversation's inbox."""


class TurnAlreadyAppliedError(ProtocolError):
    """The turn was already committed, failed or cancelled."""


class TurnNotRetryableError(ProtocolError):
    """A retry of a turn that did not fail (``status`` says where it stands); nothing changed."""


class UnknownTurnError(ConvoqError):
    """No turn with that id exists for the conversation (or its record expired)."""


class UnknownAgentError(ConvoqError):
    """No agent profile has that name."""


class TurnFailedError(ConvoqError):
    """A queued turn failed; ``remote_type`` names the error raised on the worker."""

    def __init__(self, message: str, *, remote_type: str = "", **details: Any) -> None:
        super().__init__(message, remote_type=remote_type, **details)
        self.remote_type = remote_type


class TurnCancelledError(ConvoqError):
    """A queued turn was cancelled or its approval discarded."""


class TurnTimeoutError(ConvoqError):
    """Waiting for a turn ran out of time; the turn itself goes on."""


class TurnDeadlineError(ConvoqError):
    """A turn ran longer than ``max_turn_s`` (``CONVOQ_MAX_TURN_S``): stopped and failed."""


class QueueFullError(ConvoqError):
    """A limit on queued turns is reached (``limit``: "conversation", "agent" or
    "total"); nothing was stored. Try again after ``retry_after_s`` (a hint)."""

    def __init__(
        self,
        message: str,
        *,
        limit: str = "total",
        max_queued: int = 0,
        retry_after_s: float = 1.0,
        **details: Any,
    ) -> None:
        super().__init__(
            message, limit=limit, max_queued=max_queued, retry_after_s=retry_after_s, **details
        )
        self.limit = limit
        self.max_queued = max_queued
        self.retry_after_s = retry_after_s


class SignalBacklogFullError(ConvoqError):
    """A conversation keeps as many signals of that name as allowed; nothing was kept."""


class IdempotencyKeyReusedError(ConvoqError):
    """An idempotency key sent again with another request than its first (nothing queued)."""


class ConfigurationError(ConvoqError):
    """Settings that cannot work together."""


def _rebuild(cls: type[ConvoqError], message: str) -> ConvoqError:
    """An instance of ``cls`` with ``message``, its fields left to ``__setstate__``."""
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    return err


def _all_error_classes() -> dict[str, type[ConvoqError]]:
    found: dict[str, type[ConvoqError]] = {}
    stack: list[type[ConvoqError]] = [ConvoqError]
    while stack:
        cls = stack.pop()
        found[cls.__name__] = cls
        stack.extend(cls.__subclasses__())
    return found


def error_from_data(data: dict[str, Any]) -> ConvoqError:
    """Rebuild an error stored by :meth:`ConvoqError.to_data` (the class is kept if known)."""
    name = str(data.get("type", "ConvoqError"))
    message = str(data.get("message", "the turn failed"))
    details = data.get("details") or {}
    cls = _all_error_classes().get(name)
    if cls is None or cls in (ModelHTTPError, TurnFailedError, ConversationMemoryError):
        return TurnFailedError(message, remote_type=name, remote_details=details)
    # Set the fields directly: stored details are data, and a "message" key among them
    # must not clash with the message argument.
    err = _rebuild(cls, message)
    err.message = message
    err.details = dict(details) if isinstance(details, dict) else {"details": details}
    if isinstance(err, ConversationMemoryError):
        err.response = None  # the answer of a remote turn stays in its record
    if isinstance(err, QueueFullError):
        _queue_full_fields(err, err.details)
    return err


def _queue_full_fields(err: QueueFullError, details: dict[str, Any]) -> None:
    """The fields of a QueueFullError rebuilt from data (bad values fall back)."""
    limit, max_queued, retry = (details.get(k) for k in ("limit", "max_queued", "retry_after_s"))
    err.limit = limit if isinstance(limit, str) else "total"
    err.max_queued = max_queued if isinstance(max_queued, int) else 0
    err.retry_after_s = float(retry) if isinstance(retry, (int, float)) else 1.0
