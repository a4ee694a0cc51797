"""Export and import of a conversation as one versioned JSON document, so a conversation
can move between backends (file <-> Redis, or into your own store).

Document versions (``version``; ``format`` is always ``"convoq.conversation"``):

* 1 - ``{"format", "version", "conversation_id", "messages", "summary"}``: every stored
  message in the :mod:`convoq.messages` JSON form, attachment bytes base64 inline, and
  the rolling summary (``{"text", "watermark", "version"}``) or null.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from convoq._sync import run_sync
from convoq.errors import ConversationMemoryError, CorruptDataError, UnsupportedFormatVersionError
from convoq.ids import check_conversation_id
from convoq.memory.adapt import MemoryLike, as_memory
from convoq.memory.base import ConversationMemory, StoredConversationMemory
from convoq.messages import Message
from convoq.summary import Summary
from convoq.window import split_turns

EXPORT_FORMAT = "convoq.conversation"
EXPORT_VERSION = 1


class ConversationExport(BaseModel):
    """One conversation as a document (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")
    format: Literal["convoq.conversation"] = "convoq.conversation"
    version: int = EXPORT_VERSION
    conversation_id: str
    messages: list[Message]
    summary: Summary | None = None

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, raw: str | bytes | dict[str, Any]) -> ConversationExport:
        """Parse a document; a newer or older version, or no document at all, is refused.

        Raises:
            UnsupportedFormatVersionError: another ``version``.
            CorruptDataError: not a convoq conversation document.
        """
        try:
            data = json.loads(raw) if isinstance(raw, str | bytes) else raw
        except ValueError as exc:
            raise CorruptDataError(f"the export is not JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
            raise CorruptDataError(f'the document has no "format": "{EXPORT_FORMAT}"')
        if data.get("version") != EXPORT_VERSION:
            raise UnsupportedFormatVersionError(
                f"the export has version {data.get('version')!r}; this convoq reads version"
                f" {EXPORT_VERSION}: export it again with this convoq's version",
                found=data.get("version"),
                supported=EXPORT_VERSION,
            )
        try:
            document = cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise CorruptDataError(
                f"the export does not parse at {where}: {first['msg']}"
            ) from None
        check_conversation_id(document.conversation_id)
        return document


async def aexport_conversation(
    memory: ConversationMemory | MemoryLike, conversation_id: str
) -> ConversationExport:
    """Every stored message of a conversation as a :class:`ConversationExport`."""
    check_conversation_id(conversation_id)
    if isinstance(memory, StoredConversationMemory):
        messages, summary, _ = await memory.asummary_state(conversation_id)
        return ConversationExport(
            conversation_id=conversation_id, messages=messages, summary=summary
        )
    messages = await as_memory(memory).aload(conversation_id)
    return ConversationExport(conversation_id=conversation_id, messages=messages)


async def aexport_json(memory: ConversationMemory | MemoryLike, conversation_id: str) -> bytes:
    """The document :func:`aexport_conversation` makes, as its JSON (the bytes of
    ``ConversationExport.to_json()``), built from the stored messages' JSON where the
    memory passes it through (:meth:`~convoq.memory.base.StoredConversationMemory.aload_json`):
    a Redis history of any length is exported without decoding its messages."""
    check_conversation_id(conversation_id)
    if not isinstance(memory, StoredConversationMemory):
        return (await aexport_conversation(memory, conversation_id)).to_json().encode()
    summary = await memory.asummary(conversation_id)  # first, as the state for compaction
    messages = await memory.aload_json(conversation_id)
    head = ConversationExport(conversation_id=conversation_id, messages=[], summary=summary)
    # The document with its empty message list replaced: the fields keep their order.
    before, after = head.to_json().encode().split(b',"messages":[],', 1)
    return before + b',"messages":' + messages + b"," + after


async def aimport_conversation(
    memory: ConversationMemory | MemoryLike,
    document: ConversationExport | str | bytes | dict[str, Any],
    *,
    conversation_id: str | None = None,
    replace: bool = False,
) -> str:
    """Store an exported conversation under its id (or ``conversation_id``); returns it.

    Turns are appended one by one (each within the backend's size limits); if one fails,
    what was imported is cleared again.

    Raises:
        ConversationMemoryError: the target already holds messages and not ``replace``.
        UnsupportedFormatVersionError, CorruptDataError: a document we do not read.
    """
    doc = (
        document
        if isinstance(document, ConversationExport)
        else (ConversationExport.from_json(document))
    )
    cid = check_conversation_id(conversation_id or doc.conversation_id)
    target = as_memory(memory)
    if await target.aload(cid):
        if not replace:
            raise ConversationMemoryError(
                f"conversation {cid!r} already holds messages; import with replace=True"
                " (--replace) to overwrite it, or under another conversation id",
                conversation_id=cid,
            )
        await target.aclear(cid)
    lead, turns = split_turns(doc.messages)
    chunks = [lead + turns[0], *turns[1:]] if turns else ([lead] if lead else [])
    try:
        for chunk in chunks:
            await target.aappend(cid, chunk)
        if doc.summary is not None and isinstance(target, StoredConversationMemory):
            _, _, basis = await target.asummary_state(cid)
            await target.acommit_summary(cid, doc.summary, basis)
    except BaseException:
        await target.aclear(cid)
        raise
    return cid


def export_conversation(
    memory: ConversationMemory | MemoryLike, conversation_id: str
) -> ConversationExport:
    """Blocking :func:`aexport_conversation`."""
    return run_sync(aexport_conversation(memory, conversation_id))


def export_json(memory: ConversationMemory | MemoryLike, conversation_id: str) -> bytes:
    """Blocking :func:`aexport_json`."""
    return run_sync(aexport_json(memory, conversation_id))


def import_conversation(
    memory: ConversationMemory | MemoryLike,
    document: ConversationExport | str | bytes | dict[str, Any],
    *,
    conversation_id: str | None = None,
    replace: bool = False,
) -> str:
    """Blocking :func:`aimport_conversation`."""
    return run_sync(
        aimport_conversation(memory, document, conversation_id=conversation_id, replace=replace)
    )
