"""What requests may carry: the models that validate them are the schemas the OpenAPI
document shows, so a value the document admits is one the gateway reads (and what it
refuses, the document refuses too).

A message is the text alone or a user message in its JSON form: parts ``{"type": "text",
"text": ...}``, ``{"type": "image", "data": <base64>, "mime_type": ...}`` and ``{"type":
"file", "data": <base64>, "mime_type": ..., "filename": ...}``; attachments in standard
base64 with padding. What only the deployment knows (its agents, its size limits, the
networks callbacks may reach) is checked by the client behind it.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    field_validator,
)
from pydantic_core import CoreSchema

from convoq.messages import FilePart, ImagePart, Message, TextPart
from convoq.redis._due import MAX_DELAY_S

# Stored ids: see convoq.ids. Over HTTP a conversation id also cannot hold "/" nor be
# "." or ".." (a path would split or be normalised away).
_FREE = r"[^\x00-\x1f\x7f-\x9f/]"
_NOT_DOT = r"[^\x00-\x1f\x7f-\x9f/.]"
CONVERSATION_ID = rf"^(?:{_NOT_DOT}{_FREE}*|\.{_NOT_DOT}{_FREE}*|\.\.{_FREE}+)$"
TURN_ID = r"^[A-Za-z0-9_-]{1,64}$"
CALL_ID = r"^[^/]{1,256}$"
# A Redis stream id this gateway sent (ms-seq), or "0" (or nothing) for the start.
EVENT_ID = r"^(?:0|[0-9]{1,19}-[0-9]{1,19})?$"
BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
_PORT = r"(?::(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5]?[0-9]{1,4}))?"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"


def _ipv6() -> str:
    """RFC 3986's IPv6address (what a bracketed URL host must be), as one expression."""
    h16 = "[0-9A-Fa-f]{1,4}"
    octet = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
    ls32 = rf"(?:{h16}:{h16}|(?:{octet}\.){{3}}{octet})"
    forms = [rf"(?:{h16}:){{6}}{ls32}", rf"::(?:{h16}:){{5}}{ls32}"]
    tails = [rf"(?:{h16}:){{4}}{ls32}", rf"(?:{h16}:){{3}}{ls32}", rf"(?:{h16}:){{2}}{ls32}",
             rf"{h16}:{ls32}", ls32, h16, ""]  # fmt: skip
    for before, tail in enumerate(tails):
        head = f"(?:(?:{h16}:){{0,{before}}}{h16})?" if before else f"(?:{h16})?"
        forms.append(f"{head}::{tail}")
    return "(?:" + "|".join(forms) + ")"


_HOST = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[{_ipv6()}\])"
CALLBACK_URL = rf"^https?://{_HOST}{_PORT}(?:[/?#][!-~]*)?$"
MAX_MIME_CHARS = 255


def _decoded(data: str) -> bytes:
    return base64.b64decode(data, validate=True)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextIn(_Strict):
    type: Literal["text"]
    text: str


class ImageIn(_Strict):
    type: Literal["image"]
    data: str = Field(min_length=4, pattern=BASE64, description="Standard base64, padded.")
    mime_type: str = Field(min_length=1, max_length=MAX_MIME_CHARS)
    provider_options: dict[str, Any] = Field(default_factory=dict)


class FileIn(_Strict):
    type: Literal["file"]
    data: str = Field(min_length=4, pattern=BASE64, description="Standard base64, padded.")
    mime_type: str = Field(min_length=1, max_length=MAX_MIME_CHARS)
    filename: str | None = Field(default=None, max_length=MAX_MIME_CHARS)
    provider_options: dict[str, Any] = Field(default_factory=dict)


PartIn = Annotated[TextIn | ImageIn | FileIn, Field(discriminator="type")]


class UserMessageIn(_Strict):
    """A user message: its parts in order (text, images, files)."""

    role: Literal["user"] = "user"
    content: list[PartIn] = Field(min_length=1, max_length=64)

    def message(self) -> Message:
        parts: list[TextPart | ImagePart | FilePart] = []
        for part in self.content:
            if isinstance(part, TextIn):
                parts.append(TextPart(text=part.text))
            elif isinstance(part, ImageIn):
                parts.append(ImagePart(data=_decoded(part.data), mime_type=part.mime_type,
                                       provider_options=part.provider_options))  # fmt: skip
            else:
                parts.append(FilePart(data=_decoded(part.data), mime_type=part.mime_type,
                                      filename=part.filename,
                                      provider_options=part.provider_options))  # fmt: skip
        return Message(content=parts)


class TurnOptions(_Strict):
    """How a turn runs: the fields of a submit besides its message (multipart sends
    these as form fields)."""

    agent: str = Field(min_length=1, max_length=256, description="The agent profile.")
    keep_last_turns: int | None = Field(
        default=None, ge=0, le=1_000_000, description="Previous turns sent to the model (0: all)."
    )
    max_history_tokens: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000_000,
        description="Send only the newest whole previous turns that fit this many tokens.",
    )
    if_busy: Literal["queue", "reject", "interrupt", "rollback", "merge"] = Field(
        default="queue",
        description="While another turn is in progress: queue behind it; reject (409);"
        " interrupt it at its next step boundary (its finished steps stored); roll it back"
        " (cancelled, nothing stored); merge into a queued turn sent with merge"
        " (one answer). See docs/double-texting.md.",
    )
    callback_url: str | None = Field(
        default=None,
        max_length=2048,
        pattern=CALLBACK_URL,
        description="Gets one signed POST when the turn is final.",
    )
    metadata: dict[str, Any] | None = Field(
        default=None,
        description="A JSON object stored with the turn; its tools read it as ctx.metadata"
        " (16 KiB at most; in a multipart body, a field holding the object's JSON).",
    )
    not_before: AwareDatetime | None = Field(
        default=None,
        description="Schedule the turn: it joins its conversation's line at this instant"
        " (RFC 3339 with a UTC offset), not now; its status is scheduled until then.",
    )
    delay_s: float | None = Field(
        default=None,
        ge=0,
        le=MAX_DELAY_S,
        description="Schedule the turn this many seconds from now (with not_before: the"
        " later of the two). if_busy reject refuses it while the conversation is busy now.",
    )


class ModelSettingsIn(_Strict):
    """Model settings over HTTP, merged over the profile's. The document states exactly
    what is accepted: a named ``tool_choice`` (one tool of the agent) is for the Python
    API, which knows the agent's tools."""

    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    max_tokens: int | None = Field(default=None, gt=0, le=1_000_000)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    stop: list[Annotated[str, Field(min_length=1, max_length=256)]] | None = Field(
        default=None, max_length=4
    )
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    tool_choice: Literal["auto", "required", "none"] | None = None
    parallel_tool_calls: bool | None = None
    extra_body: dict[str, Annotated[str, Field(max_length=512)] | int | bool] | None = Field(
        default=None, max_length=16, description="Merged into the request body last."
    )


class PropertyIn(_Strict):
    """One field of a typed answer."""

    type: Literal["string", "integer", "number", "boolean"]
    description: str | None = Field(default=None, max_length=1000)


class OutputSchemaIn(_Strict):
    """The shape of a typed answer over HTTP: an object of plain fields (deeper schemas
    are for the Python API's ``output_type=``)."""

    type: Literal["object"]
    properties: dict[Annotated[str, Field(min_length=1, max_length=64)], PropertyIn] = Field(
        default_factory=dict, max_length=64
    )
    # Unique, as JSON Schema wants of "required" (the client refuses a schema with a
    # name twice): the document says so, and the gateway refuses it first.
    required: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list, max_length=64, json_schema_extra={"uniqueItems": True}
    )
    additionalProperties: bool = False

    @field_validator("required")
    @classmethod
    def _unique(cls, names: list[str]) -> list[str]:
        if len(set(names)) != len(names):
            raise ValueError("names a property more than once")
        return names


class TurnRequest(TurnOptions):
    """``POST /v1/conversations/{cid}/turns`` as JSON."""

    # "model_settings" is a field, not pydantic API (pydantic < 2.10 would warn).
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model_settings: ModelSettingsIn | None = Field(
        default=None, description="Merged over the profile's (JSON body only)."
    )
    output_schema: OutputSchemaIn | None = Field(
        default=None,
        description="The JSON schema of an object the answer must fit; the result's"
        " output holds it validated (JSON body only).",
    )

    def asked(self) -> dict[str, Any]:
        """The settings and output schema as the client takes them (unset: None)."""
        settings = self.model_settings
        shape = self.output_schema
        return {
            "model_settings": settings.model_dump(exclude_none=True) if settings else None,
            "output_type": shape.model_dump() if shape else None,
        }

    message: Annotated[str, Field(min_length=1)] | UserMessageIn = Field(
        description="The user's text, or a user message."
    )

    def user_message(self) -> str | Message:
        if isinstance(self.message, UserMessageIn):
            return self.message.message()
        return self.message


class DecisionRequest(_Strict):
    """Approve or deny one pending tool call."""

    decision: Literal["approve", "deny"]
    reason: str | None = Field(default=None, max_length=2000, description="Told to the model.")
    by: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Who decided, for keys allowed to say (may_set_by); else the key's name.",
    )


def not_null(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` without its null alternative (and null default): for values that are
    either given or absent, such as form fields, headers and query parameters."""
    options = schema.get("anyOf")
    if not isinstance(options, list) or {"type": "null"} not in options:
        return schema
    rest = [o for o in options if o != {"type": "null"}]
    merged = {
        k: v for k, v in schema.items() if k != "anyOf" and not (k == "default" and v is None)
    }
    return {**merged, **rest[0]} if len(rest) == 1 else {**merged, "anyOf": rest}


class _NotNull:
    """Marks an optional header or query parameter (``Annotated[int | None, NOT_NULL,
    Query(...)]``) as given or absent: the document shows its type without null, which
    no header or query string can carry; it is read as before."""

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        return not_null(handler(schema))


NOT_NULL = _NotNull()

# The ids in request paths, with their limits in the document and checked alike.
Cid = Annotated[
    str,
    Path(min_length=1, max_length=256, pattern=CONVERSATION_ID,
         description="A conversation id (1-256 characters, no control characters, no '/')."),
]  # fmt: skip
Tid = Annotated[str, Path(pattern=TURN_ID, description="A turn id.")]
CallId = Annotated[str, Path(pattern=CALL_ID, description="A pending tool call's id.")]
