"""Conversation memory in JSON files: one file per conversation, written atomically.

Format versions (the ``format_version`` field of every file):

* 1 - the first layout; not read by this version: clear the conversation or migrate it.
* 2 - ``{"format_version": 2, "conversation_id": ..., "messages": [...]}``, messages in the
  :mod:`convoq.messages` JSON form with attachment bytes base64 inline.
* 3 - version 2 plus ``"spent": {token: expires unix ms}``: continuations of this
  conversation already resumed or discarded, kept until they expire (so one continuation
  runs once whichever process resumes it). A file with no such token is still written as
  version 2, which earlier convoq versions read.

A file name is a readable, sanitised form of the conversation id plus a hash of the whole
id (``<safe>-<sha256[:16]>.json``): ids such as ``a/b``, ``..``, ``x:y`` or ``A`` and ``a``
stay inside the directory and never share a file, even on case-insensitive file systems.
The id stored in the file is checked on every load.

Each append is a read-modify-write under an exclusive ``flock`` on the conversation's lock
file (other processes) and a striped thread lock (other threads of this process); the new
content goes to a temp file that is fsynced and renamed over the old one, so a crash leaves
the old or the new history, never half of one.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from convoq.errors import (
    ConfigurationError,
    ConversationMemoryError,
    CorruptDataError,
    UnsupportedFormatVersionError,
)
from convoq.ids import check_conversation_id
from convoq.memory import _file_extras
from convoq.memory._popping import Keep
from convoq.memory._reservations import now_ms
from convoq.memory.base import StoredConversationMemory
from convoq.messages import Message
from convoq.summary import Summary, SummaryBasis
from convoq.window import Window

FORMAT_VERSION = 3
# Versions this code reads; it writes 2 unless the file records spent tokens.
_READABLE = (2, 3)

_UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_READABLE_CHARS = 64
_HASH_CHARS = 16
# Thread locks are striped by file name: bounded memory however many conversations exist.
_STRIPES = 64


class _Document(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format_version: int
    conversation_id: str
    messages: list[Message]
    spent: dict[str, int] = Field(default_factory=dict)


def file_stem(conversation_id: str) -> str:
    """The file name (without suffix) of a conversation: readable part plus id hash."""
    readable = _UNSAFE_CHARS.sub("_", conversation_id)[:_READABLE_CHARS]
    digest = hashlib.sha256(conversation_id.encode("utf-8")).hexdigest()[:_HASH_CHARS]
    return f"{readable}-{digest}"


class FileConversationMemory(StoredConversationMemory):
    """Stores each conversation as one JSON file under ``directory``.

    Safe to share between threads, tasks and processes on one machine (``flock`` does not
    reach across NFS reliably; use Redis for several machines).

    Args:
        directory: where the files live; created with its parents if missing.
        max_file_bytes: refuse an append that would grow a conversation's file past this
            many bytes (``None``: no limit).

    Raises:
        ConversationMemoryError: ``directory`` cannot be created.
        ConfigurationError: ``max_file_bytes`` is not a positive int or ``None``.
    """

    def __init__(
        self, directory: str | os.PathLike[str], *, max_file_bytes: int | None = None
    ) -> None:
        if max_file_bytes is not None and (
            not isinstance(max_file_bytes, int) or max_file_bytes < 1
        ):
            raise ConfigurationError(
                f"max_file_bytes must be a positive int or None, not {max_file_bytes!r}"
            )
        self._directory = Path(directory)
        try:
            self._directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConversationMemoryError(
                f"cannot use {str(self._directory)!r} for conversations: {exc.strerror};"
                " give a writable directory path",
                path=str(self._directory),
            ) from None
        self._max_file_bytes = max_file_bytes
        self._stripes = [threading.Lock() for _ in range(_STRIPES)]

    @property
    def directory(self) -> Path:
        """The directory holding the conversation files."""
        return self._directory

    def path_for(self, conversation_id: str) -> Path:
        """The JSON file of a conversation (it may not exist yet)."""
        return self._directory / f"{file_stem(check_conversation_id(conversation_id))}.json"

    async def _read(self, conversation_id: str, window: Window) -> list[Message]:
        return await asyncio.to_thread(self._load_file, conversation_id)

    async def _write(self, conversation_id: str, messages: list[Message]) -> None:
        await asyncio.to_thread(self._append_file, conversation_id, messages)

    async def _delete(self, conversation_id: str) -> None:
        await asyncio.to_thread(self._delete_file, conversation_id)

    # Sync calls do their file I/O on the caller's thread: no hop to the bridge loop.
    def _read_blocking(self, conversation_id: str, window: Window) -> list[Message]:
        return self._load_file(conversation_id)

    def _write_blocking(self, conversation_id: str, messages: list[Message]) -> None:
        self._append_file(conversation_id, messages)

    def _delete_blocking(self, conversation_id: str) -> None:
        self._delete_file(conversation_id)

    async def _is_spent(self, conversation_id: str, token: str) -> bool:
        document = await asyncio.to_thread(self._load_document, conversation_id)
        return document is not None and document.spent.get(token, 0) > now_ms()

    async def _spend(self, conversation_id: str, token: str, until_ms: int) -> bool:
        return await asyncio.to_thread(self._spend_file, conversation_id, token, until_ms)

    # Blocking file code, run in worker threads.
    def _load_file(self, conversation_id: str) -> list[Message]:
        document = self._load_document(conversation_id)
        return [] if document is None else document.messages

    def _load_document(self, conversation_id: str) -> _Document | None:
        path = self.path_for(conversation_id)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _io_error("read", path, exc) from None
        return _decode(raw, path, conversation_id)

    def _append_file(self, conversation_id: str, messages: list[Message]) -> None:
        path = self.path_for(conversation_id)
        with self._locked(path):
            document = self._load_document(conversation_id) or _empty(conversation_id)
            document.messages += messages
            self._store(path, conversation_id, document)

    async def _pop_held(self, conversation_id: str, keep: Keep | None) -> Message | None:
        return await asyncio.to_thread(_file_extras.pop, self, conversation_id, keep)

    async def _prune(self, conversation_id: str, keep_last_turns: int) -> int:
        return await asyncio.to_thread(self._prune_file, conversation_id, keep_last_turns)

    def _prune_file(self, conversation_id: str, keep_last_turns: int) -> int:
        return _file_extras.prune(self, conversation_id, keep_last_turns)

    def expire(self, idle_s: float, *, now: float | None = None) -> int:
        """Delete every conversation whose file was last written ``idle_s`` seconds or
        more ago (run it from a periodic job: files have no TTL of their own). Returns how
        many were deleted; a conversation written meanwhile is kept."""
        return _file_extras.expire(self, idle_s, now)

    async def _summary_state(
        self, conversation_id: str
    ) -> tuple[list[Message], Summary | None, SummaryBasis]:
        return await asyncio.to_thread(_file_extras.summary_state, self, conversation_id)

    async def _commit_summary(
        self, conversation_id: str, summary: Summary, basis: SummaryBasis
    ) -> None:
        await asyncio.to_thread(_file_extras.commit_summary, self, conversation_id, summary, basis)

    def _spend_file(self, conversation_id: str, token: str, until_ms: int) -> bool:
        """Record ``token`` as spent in the conversation's file, under its lock."""
        path = self.path_for(conversation_id)
        with self._locked(path):
            document = self._load_document(conversation_id) or _empty(conversation_id)
            if token in document.spent:
                return False
            document.spent[token] = until_ms
            self._store(path, conversation_id, document)
            return True

    def _store(self, path: Path, conversation_id: str, document: _Document) -> None:
        """Write ``document`` (expired spent tokens dropped) in place of the file."""
        now = now_ms()
        document.spent = {t: until for t, until in document.spent.items() if until > now}
        document.format_version = FORMAT_VERSION if document.spent else 2
        raw = document.model_dump_json(exclude=None if document.spent else {"spent"}).encode()
        if self._max_file_bytes is not None and len(raw) > self._max_file_bytes:
            raise ConversationMemoryError(
                f"appending would grow {str(path)!r} to {len(raw)} bytes, over"
                f" max_file_bytes={self._max_file_bytes}; clear the conversation"
                f" (memory.clear({conversation_id!r})) or raise max_file_bytes",
                path=str(path),
                size=len(raw),
            )
        try:
            self._replace(path, raw)
        except OSError as exc:
            raise _io_error("write", path, exc) from None

    def _delete_file(self, conversation_id: str) -> None:
        path = self.path_for(conversation_id)
        with self._locked(path):
            try:
                path.unlink(missing_ok=True)
                _file_extras.summary_path(path).unlink(missing_ok=True)
                _fsync_directory(self._directory)
                # Removed while still held: a process waiting on it sees the file gone
                # once it gets the lock, and locks a fresh one (see _lock_file).
                _lock_path(path).unlink(missing_ok=True)
            except OSError as exc:
                raise _io_error("delete", path, exc) from None

    def _replace(self, path: Path, raw: bytes) -> None:
        fd, temp = tempfile.mkstemp(dir=self._directory, prefix=f".{path.stem}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(raw)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise
        # The rename itself is durable only once the directory entry is on disk.
        _fsync_directory(self._directory)

    @contextlib.contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        with self._stripes[hash(path.name) % _STRIPES]:
            try:
                fd = _lock_file(_lock_path(path))
            except OSError as exc:
                raise _io_error("lock", path, exc) from None
            try:
                yield
            finally:
                os.close(fd)  # closing the descriptor releases the flock


def _lock_path(path: Path) -> Path:
    return path.with_suffix(".lock")


def _lock_file(lock_path: Path) -> int:
    """Open a fresh descriptor on ``lock_path`` and hold an exclusive flock on it.

    A fresh open file description per call makes flock exclude threads of this process too.
    If the lock file was removed (by ``clear``) while we waited, lock the new one instead.
    """
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = os.fstat(fd)
            try:
                current = os.stat(lock_path)
            except FileNotFoundError:
                current = None
        except BaseException:
            os.close(fd)
            raise
        if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
            return fd
        os.close(fd)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _empty(conversation_id: str) -> _Document:
    return _Document(format_version=FORMAT_VERSION, conversation_id=conversation_id, messages=[])


def _decode(raw: bytes, path: Path, conversation_id: str) -> _Document:
    try:
        document = json.loads(raw)
    except ValueError as exc:
        raise _corrupt(path, conversation_id, f"it is not JSON ({exc})") from None
    if not isinstance(document, dict) or "format_version" not in document:
        raise _corrupt(path, conversation_id, "it has no format_version object at its top")
    version = document["format_version"]
    # type() check: JSON true or 2.0 is not version 2.
    if type(version) is not int or version not in _READABLE:
        raise UnsupportedFormatVersionError(
            f"conversation file {str(path)!r} has format_version {version!r}; this convoq"
            f" reads format_version {' and '.join(map(str, _READABLE))}. Clear the conversation"
            f" (memory.clear({conversation_id!r})) to start it afresh, or migrate the file"
            f" to format_version {FORMAT_VERSION}",
            path=str(path),
            found=version,
            supported=FORMAT_VERSION,
        )
    stored_id = document.get("conversation_id")
    if stored_id != conversation_id:
        raise _corrupt(path, conversation_id, f"it holds conversation {stored_id!r}")
    try:
        document = _Document.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise _corrupt(path, conversation_id, f"{where}: {first['msg']}") from None
    if version == 2 and document.spent:
        raise _corrupt(path, conversation_id, "a format_version 2 file records spent tokens")
    return document


def _corrupt(path: Path, conversation_id: str, why: str) -> CorruptDataError:
    return CorruptDataError(
        f"conversation file {str(path)!r} is corrupt: {why}. Restore it from a backup or"
        f" delete it with memory.clear({conversation_id!r})",
        path=str(path),
    )


def _io_error(action: str, path: Path, exc: OSError) -> ConversationMemoryError:
    return ConversationMemoryError(
        f"could not {action} conversation file {str(path)!r}: {exc.strerror or exc};"
        " check the directory's permissions and free space",
        path=str(path),
    )
