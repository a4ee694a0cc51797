"""The file backend's summary, pruning and expiry: each a read-modify-write under the
conversation's lock (:meth:`FileConversationMemory._locked`).

The summary lives beside the conversation's file, in ``<name>.summary`` (JSON
``{"format_version": 1, "conversation_id": ..., "summary": {...}}``), written atomically
like the history; so the history file's format is unchanged. Committing one checks the
history and the previous summary under the lock: the lock is the fence. A pop that
takes a message of a turn the summary covers drops the summary (it told of that message).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, ValidationError

from convoq.errors import ConfigurationError, CorruptDataError
from convoq.memory._popping import Keep, covers_newest_turn, kept_in_place
from convoq.memory.base import basis_of, summary_conflict
from convoq.messages import Message
from convoq.summary import Summary, SummaryBasis
from convoq.window import split_turns

if TYPE_CHECKING:
    from convoq.memory.file import FileConversationMemory

SUMMARY_FORMAT_VERSION = 1


class _SummaryFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format_version: int
    conversation_id: str
    summary: Summary


def summary_path(path: Path) -> Path:
    return path.with_suffix(".summary")


def read_summary(path: Path, conversation_id: str) -> Summary | None:
    try:
        raw = summary_path(path).read_bytes()
    except FileNotFoundError:
        return None
    try:
        stored = _SummaryFile.model_validate_json(raw)
    except ValidationError:
        stored = None
    if (
        stored is None
        or stored.format_version != SUMMARY_FORMAT_VERSION
        or stored.conversation_id != conversation_id
    ):
        raise CorruptDataError(
            f"summary file {str(summary_path(path))!r} does not parse; delete it to drop"
            " the summary (the history is unaffected)",
            path=str(summary_path(path)),
        )
    return stored.summary


def _write_summary(memory: FileConversationMemory, path: Path, cid: str, summary: Summary) -> None:
    document = _SummaryFile(
        format_version=SUMMARY_FORMAT_VERSION, conversation_id=cid, summary=summary
    )
    memory._replace(summary_path(path), document.model_dump_json().encode("utf-8"))


def summary_state(
    memory: FileConversationMemory, cid: str
) -> tuple[list[Message], Summary | None, SummaryBasis]:
    path = memory.path_for(cid)
    with memory._locked(path):
        messages = memory._load_file(cid)
        summary = read_summary(path, cid)
    return messages, summary, basis_of(messages, summary)


def commit_summary(
    memory: FileConversationMemory, cid: str, summary: Summary, basis: SummaryBasis
) -> None:
    path = memory.path_for(cid)
    with memory._locked(path):
        if basis_of(memory._load_file(cid), read_summary(path, cid)) != basis:
            raise summary_conflict(cid)
        _write_summary(memory, path, cid, summary)


def prune(memory: FileConversationMemory, cid: str, keep_last_turns: int) -> int:
    path = memory.path_for(cid)
    with memory._locked(path):
        document = memory._load_document(cid)
        if document is None:
            return 0
        lead, turns = split_turns(document.messages)
        kept = turns[len(turns) - keep_last_turns :] if keep_last_turns else []
        document.messages = lead + [m for turn in kept for m in turn]
        memory._store(path, cid, document)
        dropped = len(turns) - len(kept)
        summary = read_summary(path, cid)
        if summary is not None and dropped:  # it stays, covering fewer stored turns
            watermark = max(0, summary.watermark - dropped)
            _write_summary(memory, path, cid, summary.model_copy(update={"watermark": watermark}))
        return dropped


def pop(memory: FileConversationMemory, cid: str, keep: Keep | None) -> Message | None:
    """The newest message out (and a summary that told of its turn), under the lock."""
    path = memory.path_for(cid)
    with memory._locked(path):
        document = memory._load_document(cid)
        if document is None or not document.messages:
            return None
        newest = document.messages[-1]
        kept = kept_in_place(keep, newest)
        covered = covers_newest_turn(document.messages, read_summary(path, cid))
        document.messages = document.messages[:-1] + kept
        memory._store(path, cid, document)
        if covered:
            summary_path(path).unlink(missing_ok=True)
        return newest


def expire(memory: FileConversationMemory, idle_s: float, now: float | None) -> int:
    if idle_s <= 0:
        raise ConfigurationError(f"idle_s must be > 0, not {idle_s!r}")
    cutoff = (time.time() if now is None else now) - idle_s
    deleted = 0
    for path in memory.directory.glob("*.json"):
        with memory._locked(path):
            try:
                if path.stat().st_mtime > cutoff:
                    continue
                path.unlink()
                summary_path(path).unlink(missing_ok=True)
                path.with_suffix(".lock").unlink(missing_ok=True)
            except FileNotFoundError:
                continue
        deleted += 1
    return deleted
