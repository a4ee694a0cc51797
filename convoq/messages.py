"""Messages and their parts, with one JSON form (bytes as base64) for every backend.

A *turn* is one user message and everything up to the next user message. History is a
list of turns, optionally preceded by leading system/developer messages.
"""

from __future__ import annotations

import base64
import copy
import json
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    model_serializer,
    model_validator,
)

from convoq.errors import InvalidMessageError
from convoq.usage import Usage

# Messages and their parts are values: a field is never reassigned (``model_copy(update=...)``
# makes a changed one), so one decoded message can be handed to every reader of a stored
# turn (see :func:`shared_message`).
_BYTES_AS_BASE64 = ConfigDict(val_json_bytes="base64", frozen=True)


def _standard_base64(data: bytes) -> str:
    # pydantic's own "base64" mode writes the URL-safe alphabet; files and Redis records
    # use the standard one so any base64 decoder reads them. Reading accepts both.
    return base64.b64encode(data).decode("ascii")


Base64Bytes = Annotated[bytes, PlainSerializer(_standard_base64, return_type=str, when_used="json")]


class MessageRole(StrEnum):
    """Who speaks a message."""

    SYSTEM = "system"
    DEVELOPER = "developer"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class TextPart(BaseModel):
    """Plain text."""

    model_config = _BYTES_AS_BASE64
    type: Literal["text"] = "text"
    text: str


class ImagePart(BaseModel):
    """An image given as bytes; ``provider_options`` pass through (e.g. ``{"detail": "low"}``)."""

    model_config = _BYTES_AS_BASE64
    type: Literal["image"] = "image"
    data: Base64Bytes
    mime_type: str
    provider_options: dict[str, Any] = Field(default_factory=dict)


class FilePart(BaseModel):
    """A file given as bytes (PDFs and others), with its file name when known."""

    model_config = _BYTES_AS_BASE64
    type: Literal["file"] = "file"
    data: Base64Bytes
    mime_type: str
    filename: str | None = None
    provider_options: dict[str, Any] = Field(default_factory=dict)


Part = Annotated[TextPart | ImagePart | FilePart, Field(discriminator="type")]
AttachmentPart = ImagePart | FilePart

# Integrations once kept a framework's own record of a message as a last file part of this
# type, which model wires then sent (or refused). Messages stored that way still load: the
# part is taken out of ``content`` and its record put in ``framework`` as it is now kept.
LEGACY_RECORD_MIME_TYPE = "application/vnd.convoq.original+json"
# Where a legacy record that does not parse goes: the integration reading it reports it.
UNREADABLE_RECORD = "convoq-unreadable"


class ToolCall(BaseModel):
    """A call the model asks for; ``arguments`` is the decoded JSON object."""

    model_config = ConfigDict(frozen=True)
    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


MAX_MODEL_NAME = 200
"""The longest model name a message keeps (a per-model counter names it)."""

# Set only on assistant messages a model produced (and, for decision, on the tool result
# of a call that waited for approval); left out of the JSON when unset, so messages
# without them are stored exactly as before these fields existed.
_MODEL_FIELDS = ("refusal", "usage", "finish_reason", "model", "decision", "framework")


class Decision(BaseModel):
    """A human's answer to a tool call that needs approval, for the audit trail: who
    decided (``by``), when (``at_ms``, unix ms) and why (``reason``). ``expired``: no one
    decided before the approval's time ran out (then ``approved`` is False).

    A call that waits for the world (:mod:`convoq.waits`) is decided by what arrives:
    ``result`` is the JSON text of a deferred call's result or of a signal's payload
    (``is_error``: an error result, its message the text), ``by`` who sent it;
    ``expired``: nothing arrived before the wait's deadline."""

    model_config = ConfigDict(frozen=True)
    approved: bool
    reason: str | None = None
    by: str | None = None
    at_ms: int | None = None
    expired: bool = False
    result: str | None = None
    is_error: bool = False

    @model_serializer(mode="wrap")
    def _without_unset_result(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A person's decision is stored and shown exactly as before results existed.
        data: dict[str, Any] = handler(self)
        if self.result is None and not self.is_error:
            data.pop("result", None)
            data.pop("is_error", None)
        return data


class Message(BaseModel):
    """One message of a conversation. ``role`` defaults to user.

    On an assistant message from a model call: ``refusal`` is the model's refusal text
    (the API's ``refusal`` field; ``content`` is then usually empty), ``usage`` the tokens
    that call reported, ``finish_reason`` why it stopped (``"stop"``, ``"length"``,
    ``"tool_calls"``, ``"content_filter"``...) and ``model`` the name of the model that
    answered (as the agent names it: what a price table prices); each None when not
    reported, and then not stored.
    ``framework``: what another framework's integration (:mod:`convoq.integrations`)
    keeps of the message beyond convoq's fields, as JSON by framework name (its own record
    of the message, without the attachment bytes the parts hold); no model wire sends it.
    A message stored with such a record as its last file part (of type
    :data:`LEGACY_RECORD_MIME_TYPE`, as earlier versions kept it) loads with the record
    moved here.
    """

    model_config = _BYTES_AS_BASE64
    role: MessageRole = MessageRole.USER
    content: list[Part] = Field(default_factory=list)
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    refusal: str | None = None
    usage: Usage | None = None
    finish_reason: str | None = None
    model: str | None = Field(default=None, max_length=MAX_MODEL_NAME)
    decision: Decision | None = None
    # What another agent framework says of this message beyond convoq's fields (JSON, by
    # framework name), kept by the integration that wrote it to rebuild its own form;
    # never part of what a model is sent.
    framework: dict[str, Any] | None = None

    @model_serializer(mode="wrap")
    def _drop_unset_model_fields(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for key in _MODEL_FIELDS:
                if key in data and data[key] is None:
                    del data[key]
        return data

    @model_validator(mode="after")
    def _legacy_record_to_framework(self) -> Message:
        content = self.content
        if content and content[-1].type == "file":
            last = content[-1]
            if isinstance(last, FilePart) and last.mime_type == LEGACY_RECORD_MIME_TYPE:
                # Frozen: the instance is still being built, so its fields are set here.
                self.__dict__["content"] = content[:-1]
                framework = {**(self.framework or {}), **_legacy_record(last.data)}
                self.__dict__["framework"] = framework
        return self

    @property
    def text(self) -> str:
        """The text parts joined in order."""
        return "".join(p.text for p in self.content if isinstance(p, TextPart))

    @property
    def attachments(self) -> list[ImagePart | FilePart]:
        """The image and file parts, in order."""
        return [p for p in self.content if not isinstance(p, TextPart)]

    @classmethod
    def user(cls, text: str) -> Message:
        return cls(role=MessageRole.USER, content=[TextPart(text=text)])

    @classmethod
    def system(cls, text: str) -> Message:
        return cls(role=MessageRole.SYSTEM, content=[TextPart(text=text)])

    @classmethod
    def assistant(
        cls,
        text: str,
        tool_calls: list[ToolCall] | None = None,
        *,
        refusal: str | None = None,
        usage: Usage | None = None,
        finish_reason: str | None = None,
        model: str | None = None,
    ) -> Message:
        content: list[TextPart | ImagePart | FilePart] = [TextPart(text=text)] if text else []
        return cls(
            role=MessageRole.ASSISTANT, content=content, tool_calls=tool_calls or [],
            refusal=refusal, usage=usage, finish_reason=finish_reason, model=model,
        )  # fmt: skip

    @classmethod
    def tool_result(cls, call: ToolCall, text: str, decision: Decision | None = None) -> Message:
        """The result of ``call``; ``decision``: the approval it waited for, if any (kept
        with the stored turn as its audit trail, never sent to a model)."""
        return cls(
            role=MessageRole.TOOL,
            content=[TextPart(text=text)],
            tool_call_id=call.id,
            name=call.name,
            decision=decision,
        )


def _legacy_record(data: bytes) -> dict[str, Any]:
    """``{framework: record}`` of a legacy record part, the record without its
    ``framework`` key (exactly what an integration keeps in ``framework`` now)."""
    try:
        record = json.loads(data)
    except ValueError:
        record = None
    if isinstance(record, dict) and isinstance(record.get("framework"), str):
        name = record.pop("framework")
        return {name: record}
    return {UNREADABLE_RECORD: data.decode("utf-8", errors="replace")}


class GenerationRequest(BaseModel):
    """Messages sent as they are: memory is neither loaded nor written."""

    model_config = _BYTES_AS_BASE64
    messages: list[Message]


MessageList = TypeAdapter(list[Message])


def _read_only(*_args: Any, **_kwargs: Any) -> Any:
    raise InvalidMessageError(
        "this message is shared read-only: every load of its stored turn in this process gets"
        " the same object (the store keeps decoded turns, see CONVOQ_DECODED_CACHE_BYTES);"
        " change a copy: message.model_copy(deep=True), or build a new list",
        rule="read_only",
    )


class ReadOnlyList(list):  # type: ignore[type-arg]
    """A list a shared message holds (its parts, its tool calls, JSON inside them): equal
    to any list with the same items, JSON like one, but every change raises
    InvalidMessageError. Copies (``copy.deepcopy``, ``model_copy(deep=True)``) and pickles
    are plain lists."""

    __slots__ = ()
    append = extend = insert = pop = remove = clear = sort = reverse = _read_only
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _read_only

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (list(self),))

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return copy.deepcopy(list(self), memo)


class ReadOnlyDict(dict):  # type: ignore[type-arg]
    """The dict twin of :class:`ReadOnlyList` (tool call arguments, provider options,
    ``framework``)."""

    __slots__ = ()
    __setitem__ = __delitem__ = __ior__ = _read_only
    clear = pop = popitem = setdefault = update = _read_only

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (dict(self),))

    def __copy__(self) -> dict[Any, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[Any, Any]:
        return copy.deepcopy(dict(self), memo)


def _read_only_json(value: Any) -> Any:
    """``value`` (decoded JSON) with every list and dict in it read-only."""
    if isinstance(value, dict):
        return ReadOnlyDict({k: _read_only_json(v) for k, v in value.items()})
    if isinstance(value, list):
        return ReadOnlyList(_read_only_json(v) for v in value)
    return value


_NO_CALLS = ReadOnlyList()
# Fields of parts and tool calls that hold JSON of their own.
_DICT_FIELDS = ("arguments", "provider_options")
# pydantic gives each instance a set of the fields it was given; shared messages and parts
# share one per distinct set (pydantic copies it before it changes one), which leaves the
# garbage collector two objects less to walk per kept message. A handful of sets in all.
_FIELDS_SETS: dict[frozenset[str], set[str]] = {}
_LAST_FIELDS_SET: dict[type[BaseModel], set[str]] = {}


def shared_message(message: Message) -> Message:
    """``message``, made safe to hand to every reader: its lists and dicts (and those of
    its parts and tool calls) become :class:`ReadOnlyList` / :class:`ReadOnlyDict`; with
    the frozen models themselves, nothing about it can change. For a message just decoded
    from storage and not yet handed out (it is changed in place, then never again)."""
    fields = message.__dict__
    content = fields["content"]
    for part in content:
        if part.__class__ is not TextPart:  # text parts hold nothing that changes
            _share_dicts(part)
        _share_fields_set(part)
    fields["content"] = ReadOnlyList(content)
    calls = fields["tool_calls"]
    if calls:
        for call in calls:
            _share_dicts(call)
        fields["tool_calls"] = ReadOnlyList(calls)
    else:
        fields["tool_calls"] = _NO_CALLS
    if fields["framework"] is not None:
        fields["framework"] = _read_only_json(fields["framework"])
    _share_fields_set(message)
    return message


def with_shared_field_sets(message: Message) -> Message:
    """``message`` with its field set and its parts' shared (see ``_FIELDS_SETS``): two
    objects less per message of one part for the garbage collector. Its lists stay its
    own. For a message just decoded from storage, not yet handed out."""
    for part in message.content:
        _share_fields_set(part)
    _share_fields_set(message)
    return message


def _share_fields_set(model: BaseModel) -> None:
    given = model.__pydantic_fields_set__
    # Most models of a kind were given the same fields as the one before: comparing with
    # its set is cheaper than hashing a frozenset per model.
    shared = _LAST_FIELDS_SET.get(model.__class__)
    if shared is None or shared != given:
        key = frozenset(given)
        shared = _FIELDS_SETS.get(key)
        if shared is None:
            shared = _FIELDS_SETS.setdefault(key, given)
        _LAST_FIELDS_SET[model.__class__] = shared
    object.__setattr__(model, "__pydantic_fields_set__", shared)


def _share_dicts(model: BaseModel) -> None:
    for name in _DICT_FIELDS:
        value = model.__dict__.get(name)
        if value is not None:
            model.__dict__[name] = _read_only_json(value)


def messages_to_json(messages: list[Message]) -> bytes:
    """The one JSON form of a message list (attachments as base64)."""
    return MessageList.dump_json(messages)


def messages_from_json(raw: str | bytes) -> list[Message]:
    return MessageList.validate_json(raw)


def check_user_message(message: Message) -> Message:
    """Check the rules for a single-message input; raise naming the broken rule.

    Raises:
        InvalidMessageError: role is not user, no parts, tool calls or a tool_call_id.
    """
    if message.role != MessageRole.USER:
        raise InvalidMessageError(
            f"a single message must have role 'user', not {message.role.value!r}",
            rule="role_user",
        )
    if not message.content:
        raise InvalidMessageError("a user message needs at least one part", rule="non_empty")
    if message.tool_calls:
        raise InvalidMessageError("a user message cannot carry tool calls", rule="no_tool_calls")
    if message.tool_call_id is not None:
        raise InvalidMessageError(
            "a user message cannot carry a tool_call_id", rule="no_tool_call_id"
        )
    return message


def coerce_user_message(value: str | Message) -> Message:
    """A ``str`` becomes a user text message; a ``Message`` is checked."""
    if isinstance(value, str):
        if not value:
            raise InvalidMessageError("a user message needs at least one part", rule="non_empty")
        return Message.user(value)
    if isinstance(value, Message):
        return check_user_message(value)
    raise InvalidMessageError(
        f"expected a str or a user Message, got {type(value).__name__}", rule="type"
    )
