"""``convoq export`` / ``convoq import``: a conversation as one versioned JSON document,
from and to Redis (the configured one) or a file-memory directory (``--dir``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from convoq.cli._render import console, err_console, fail, reported
from convoq.memory.base import StoredConversationMemory
from convoq.memory.file import FileConversationMemory
from convoq.memory.transfer import export_json, import_conversation
from convoq.settings import ConvoqSettings

DirOption = Annotated[
    Path | None, typer.Option("--dir", help="A file-memory directory instead of Redis.")
]


def _memory(directory: Path | None, settings: ConvoqSettings) -> StoredConversationMemory:
    if directory is not None:
        return FileConversationMemory(directory)
    from convoq.memory.redis import RedisConversationMemory

    return RedisConversationMemory(settings.redis_url, prefix=settings.prefix, home=settings.home)


def register(app: typer.Typer, settings: typer.models.CommandFunctionType) -> None:
    """Add the two commands to ``app``; ``settings()`` resolves the CONVOQ_* settings."""

    @app.command("export")
    def export_command(
        conversation_id: str,
        out: Annotated[Path | None, typer.Option(help="Write here instead of stdout.")] = None,
        directory: DirOption = None,
    ) -> None:
        """Print (or write) a conversation as one versioned JSON document."""
        if out is not None:
            _check_out(out)  # before anything is read
        with reported():
            memory = _memory(directory, settings())
            try:
                # The stored JSON passed through: no message of a long history decoded.
                raw = export_json(memory, conversation_id).decode("utf-8")
            finally:
                _close(memory)
        if out is None:
            sys.stdout.write(raw + "\n")
            return
        try:
            out.write_text(raw, encoding="utf-8")
        except OSError as exc:
            raise fail(f"could not write {out}: {exc.strerror or exc}") from None
        err_console.print(f"exported {conversation_id} to {out}")

    @app.command("import")
    def import_command(
        file: Path,
        conversation_id: Annotated[
            str | None, typer.Option(help="Store under this id instead of the exported one.")
        ] = None,
        replace: Annotated[bool, typer.Option(help="Overwrite an existing history.")] = False,
        directory: DirOption = None,
    ) -> None:
        """Store a conversation exported with ``convoq export``."""
        raw = _read_export(file)
        with reported():
            memory = _memory(directory, settings())
            try:
                cid = import_conversation(
                    memory, raw, conversation_id=conversation_id, replace=replace
                )
            finally:
                _close(memory)
        console.print(f"imported {cid}")


def _check_out(out: Path) -> None:
    """Refuse an ``--out`` that cannot be written as a file (exit code 2)."""
    if out.is_dir():
        raise fail(
            f"--out {out} is a directory; give a file path, e.g. {out / 'conversation.json'}", 2
        )
    if not out.parent.is_dir():
        raise fail(f"--out {out}: the directory {out.parent} does not exist; create it first", 2)


def _read_export(file: Path) -> bytes:
    """The bytes of an export file (exit code 2 when the path names no file)."""
    if file.is_dir():
        raise fail(f"{file} is a directory; give the file convoq export wrote", 2)
    if not file.exists():
        raise fail(f"no file at {file}; give the path of a file convoq export wrote", 2)
    try:
        return file.read_bytes()
    except OSError as exc:
        raise fail(f"could not read {file}: {exc.strerror or exc}") from None


def _close(memory: StoredConversationMemory) -> None:
    close = getattr(memory, "close", None)
    if callable(close):
        close()
