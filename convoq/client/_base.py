"""Building and checking a submission: pure functions, no I/O.

Everything a client can refuse is refused here, before anything is queued: the
conversation id, the message (a ``str`` or a user :class:`Message`), attachment sizes, the
agent name (against a known set), ``keep_last_turns``, ``callback_url``, ``if_busy``,
the idempotency key and the metadata.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, cast, get_args
from urllib.parse import urlsplit

from convoq.context import check_metadata
from convoq.errors import (
    AttachmentError,
    ConvoqError,
    IdempotencyKeyReusedError,
    InvalidCallbackUrlError,
    InvalidMessageError,
    InvalidScheduleError,
    UnknownAgentError,
)
from convoq.ids import check_conversation_id, check_turn_id, new_turn_id
from convoq.limits import Limits, attachment_too_large, turn_too_large
from convoq.messages import GenerationRequest, Message, coerce_user_message
from convoq.model_settings import SettingsLike, coerce_settings, settings_to_data
from convoq.output import OutputType, output_shape, spec_from_data
from convoq.redis._due import Due, check_due
from convoq.redis._texting import merge_key_of
from convoq.window import check_budget

if TYPE_CHECKING:
    from convoq.redis.protocol import TurnRecord

IfBusy = Literal["queue", "reject", "interrupt", "rollback", "merge"]

MAX_IDEMPOTENCY_KEY_CHARS = 256
MAX_CALLBACK_URL_CHARS = 2048


@dataclass(frozen=True)
class Submission:
    """A checked turn, ready for the protocol's ``submit``."""

    conversation_id: str
    turn_id: str
    agent: str
    message: Message
    options: dict[str, Any]
    idempotency_key: str | None
    if_busy: IfBusy
    # A scheduled turn: when it joins its conversation's line (None: at once).
    due: Due | None = None

    @property
    def merge_key(self) -> str | None:
        """With ``if_busy="merge"``: what a queued turn shares with this one to be merged
        (the agent and the options; docs/double-texting.md)."""
        return merge_key_of(self.agent, self.options) if self.if_busy == "merge" else None


def build_submission(
    conversation_id: str,
    message: str | Message,
    *,
    agent: str,
    known_agents: Collection[str] | None,
    limits: Limits,
    idempotency_key: str | None = None,
    keep_last_turns: int | None = None,
    callback_url: str | None = None,
    if_busy: str = "queue",
    max_history_tokens: int | None = None,
    model_settings: SettingsLike | None = None,
    output_type: OutputType | None = None,
    metadata: dict[str, Any] | None = None,
    not_before: datetime | None = None,
    delay_s: float | None = None,
) -> Submission:
    """Check every argument of ``submit`` and return the turn to queue.

    Raises:
        InvalidConversationIdError, InvalidMessageError, AttachmentError,
        InvalidCallbackUrlError, UnknownAgentError, InvalidScheduleError or ConvoqError
        (naming the argument): nothing is queued.
    """
    cid = check_conversation_id(conversation_id)
    if isinstance(message, GenerationRequest):
        raise InvalidMessageError(
            "submit queues a turn of a stored conversation: one user message that a worker"
            " answers with the conversation's history and then stores. A GenerationRequest"
            " is sent as given and bypasses memory, so it cannot be queued: run it in"
            " process with Agent.generate(GenerationRequest(...)), or submit its user"
            " message as str or Message",
            rule="generation_request",
        )
    user = coerce_user_message(message)
    check_attachments(user, limits)
    check_agent(agent, known_agents)
    options: dict[str, Any] = {}
    if keep_last_turns is not None:
        if isinstance(keep_last_turns, bool) or not isinstance(keep_last_turns, int):
            raise ConvoqError("keep_last_turns must be an int >= 0 (0 sends the whole history)")
        if keep_last_turns < 0:
            raise ConvoqError("keep_last_turns must be >= 0 (0 sends the whole history)")
        options["keep_last_turns"] = keep_last_turns
    if check_budget(max_history_tokens) is not None:
        options["max_history_tokens"] = max_history_tokens
    if callback_url is not None:
        options["callback_url"] = check_callback_url(callback_url)
    options.update(asked_options(model_settings, output_type))
    if meta := check_metadata(metadata):
        options["metadata"] = meta
    due = check_due(not_before, delay_s)
    busy = check_if_busy(if_busy)
    if due is not None:
        check_scheduled_if_busy(busy)
        # Kept with the turn: an idempotency key sent again with another time is refused.
        asked = {"at_ms": due.at_ms, "delay_s": delay_s}
        options["schedule"] = {k: v for k, v in asked.items() if v is not None}
    return Submission(
        conversation_id=cid,
        turn_id=new_turn_id(),
        agent=agent,
        message=user,
        options=options,
        idempotency_key=check_idempotency_key(idempotency_key),
        if_busy=busy,
        due=due,
    )


def asked_options(settings: SettingsLike | None, output: OutputType | None) -> dict[str, Any]:
    """What a turn asks of the model, as the JSON its record keeps: ``model_settings``
    and ``output`` (an OutputSpec; a worker checks answers against its JSON schema, so
    the schema is checked here as a worker will, before anything is queued).

    Raises:
        InvalidModelSettingsError, InvalidOutputTypeError: nothing is queued.
    """
    options: dict[str, Any] = {}
    checked = settings_to_data(coerce_settings(settings))
    if checked:
        options["model_settings"] = checked
    shape = output_shape(output)
    if shape is not None:
        options["output"] = spec_from_data(shape.spec.model_dump(mode="json")).spec.model_dump(
            mode="json"
        )
    return options


def check_attachments(message: Message, limits: Limits) -> None:
    """Refuse empty or oversize attachments and turns over the total limit."""
    total = len(message.text.encode())
    for index, part in enumerate(message.attachments):
        size = len(part.data)
        name = getattr(part, "filename", None) or f"attachment {index} ({part.mime_type})"
        if size == 0:
            raise AttachmentError(f"{name} is empty: an attachment needs at least one byte")
        if size > limits.max_attachment_bytes:
            raise attachment_too_large(size, limits, name)
        total += size
    if total > limits.max_turn_bytes:
        raise turn_too_large(total, limits, "the message")


def check_agent(agent: object, known: Collection[str] | None) -> str:
    """``agent`` must be a non-empty str and, when ``known`` is given, one of them."""
    if not isinstance(agent, str) or not agent:
        raise UnknownAgentError(f"agent must be a profile name (a non-empty str), not {agent!r}")
    if known is not None and agent not in known:
        raise UnknownAgentError(
            f"no agent profile named {agent!r}; known profiles: {sorted(known)}",
            agent=agent,
            known=sorted(known),
        )
    return agent


def check_callback_url(url: object) -> str:
    """An absolute http(s) URL with a host, of at most MAX_CALLBACK_URL_CHARS characters.

    Raises:
        InvalidCallbackUrlError: anything else (nothing is queued).
    """
    if not isinstance(url, str) or not url or len(url) > MAX_CALLBACK_URL_CHARS:
        raise InvalidCallbackUrlError(
            f"callback_url must be an http(s) URL of 1 to {MAX_CALLBACK_URL_CHARS} characters",
            length=len(url) if isinstance(url, str) else None,
        )
    shown = url[:100]
    # Whitespace or control characters would fail (or be rewritten) only when the
    # webhook is sent, long after the caller could fix them.
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        raise InvalidCallbackUrlError(
            f"callback_url {shown!r} contains whitespace or control characters;"
            " percent-encode them",
            callback_url=shown,
        )
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError for a port that is not a number)
    except ValueError as exc:
        raise InvalidCallbackUrlError(
            f"callback_url {shown!r} does not parse as a URL ({exc})", callback_url=shown
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidCallbackUrlError(
            f"callback_url {shown!r} is not an absolute http:// or https:// URL with a host",
            callback_url=shown,
        )
    return url


def check_idempotency_key(key: object) -> str | None:
    """``None`` or a non-empty str of bounded length (it is hashed before any key)."""
    if key is None:
        return None
    if not isinstance(key, str) or not key or len(key) > MAX_IDEMPOTENCY_KEY_CHARS:
        raise ConvoqError(
            f"idempotency_key must be a non-empty str of at most {MAX_IDEMPOTENCY_KEY_CHARS}"
            " characters"
        )
    return key


def check_scheduled_if_busy(if_busy: IfBusy) -> Literal["queue", "reject"]:
    """``if_busy`` of a scheduled turn: "queue", or "reject" (checked when it is
    scheduled). The double-texting modes act on the turn in progress when a message
    arrives; a scheduled turn arrives when it is due, as a turn of its own.

    Raises:
        InvalidScheduleError: "interrupt", "rollback" or "merge" with a due time.
    """
    if if_busy in ("queue", "reject"):
        return if_busy
    raise InvalidScheduleError(
        f"if_busy={if_busy!r} cannot be scheduled: it acts on the turn in progress when a"
        " message arrives, and a scheduled turn joins its conversation's line when due;"
        " submit it with if_busy='queue' (or 'reject', checked now), or without a delay"
    )


def check_if_busy(value: object) -> IfBusy:
    """``"queue"`` (wait behind running turns), ``"reject"`` (ConversationBusyError), or a
    double-texting mode: ``"interrupt"``, ``"rollback"``, ``"merge"``
    (docs/double-texting.md)."""
    for mode in get_args(IfBusy):
        if value == mode:
            return cast(IfBusy, mode)
    raise ConvoqError(f"if_busy must be one of {list(get_args(IfBusy))}, not {value!r}")


def check_turn_ref(conversation_id: object, turn_id: object) -> tuple[str, str]:
    """Both ids of a turn, checked."""
    return check_conversation_id(conversation_id), check_turn_id(turn_id)


def check_call_id(call_id: object) -> str:
    """A tool call id: a non-empty str."""
    if not isinstance(call_id, str) or not call_id or len(call_id) > 256:
        raise InvalidMessageError(
            f"call_id must be a non-empty str, not {call_id!r}", rule="call_id"
        )
    return call_id


def check_callback_signable(options: dict[str, Any], webhook_secret: str | None) -> None:
    """A ``callback_url`` needs the webhook secret where the turn is submitted: callbacks
    are only sent signed, and settings resolve alike for clients and workers, so a client
    without ``CONVOQ_WEBHOOK_SECRET`` stands for workers that could never sign one.

    Raises:
        InvalidCallbackUrlError: a callback_url and no secret (nothing is queued).
    """
    if options.get("callback_url") and not webhook_secret:
        raise InvalidCallbackUrlError(
            "callback_url given, but this deployment cannot sign callbacks:"
            " CONVOQ_WEBHOOK_SECRET is not set where the turn was submitted (callbacks are"
            " only sent signed). Set the workers' secret on clients and gateways too"
            " (Client(webhook_secret=...)), or submit without callback_url",
            reason="no_webhook_secret",
            setting="CONVOQ_WEBHOOK_SECRET",
        )


def idempotency_mismatch(sub: Submission, first: TurnRecord, ignored: str) -> list[str]:
    """What differs between a submission and the turn its idempotency key names (agent,
    message, or the option names); ``ignored``: an option that is no part of the request
    (the trace context)."""
    mismatch = []
    if first.agent != sub.agent:
        mismatch.append("agent")
    if first.input != sub.message:
        mismatch.append("message")
    stored = {k: v for k, v in first.options.items() if k != ignored}
    given = {k: v for k, v in sub.options.items() if k != ignored}
    mismatch += sorted(k for k in stored.keys() | given.keys() if stored.get(k) != given.get(k))
    return mismatch


def idempotency_conflict(
    sub: Submission, first: str, mismatch: list[str]
) -> IdempotencyKeyReusedError:
    """The error for an idempotency key reused with another request."""
    return IdempotencyKeyReusedError(
        f"idempotency key {sub.idempotency_key!r} was first used for turn {first!r} with"
        f" another request (it differs in {', '.join(mismatch)}): a retry must repeat the request"
        " exactly; use a new key for a new request",
        idempotency_key=sub.idempotency_key,
        turn_id=first,
        mismatch=mismatch,
    )
