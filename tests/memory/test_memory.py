"""Conversation memory: one body per behaviour, run on every backend; then the file format."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from convoq._sync import run_sync
from convoq.errors import (
    ConfigurationError,
    ConversationMemoryError,
    ConvoqError,
    CorruptDataError,
    InvalidConversationIdError,
    InvalidMessageError,
    UnsupportedFormatVersionError,
)
from convoq.loaders import load_image, load_pdf
from convoq.memory import ConversationMemory, FileConversationMemory
from convoq.messages import FilePart, ImagePart, Message, MessageRole, TextPart, ToolCall
from convoq.window import last_turns

REPO = Path(__file__).resolve().parents[2]
APPEND_WORKER = Path(__file__).resolve().parents[1] / "support" / "append_worker.py"


def magic_bytes(prefix: bytes, seed: int, size: int = 6 * 1024) -> bytes:
    """Random bytes behind a real magic prefix: every byte value occurs, nothing is text."""
    return prefix + random.Random(seed).randbytes(size)


def whole_turn(seed: int = 0) -> list[Message]:
    """A user message with text, an image and a PDF; a tool exchange; the final answer."""
    png = magic_bytes(b"\x89PNG\r\n\x1a\n", seed)
    pdf = magic_bytes(b"%PDF-1.7\n", seed + 1)
    calls = [
        ToolCall(id=f"call-{seed}-a", name="lookup", arguments={"q": "weather", "n": 2}),
        ToolCall(id=f"call-{seed}-b", name="convert", arguments={"unit": "C"}),
    ]
    return [
        Message(
            role=MessageRole.USER,
            content=[
                TextPart(text=f"look at these {seed}"),
                ImagePart(data=png, mime_type="image/png", provider_options={"detail": "low"}),
                TextPart(text="and this"),
                FilePart(
                    data=pdf,
                    mime_type="application/pdf",
                    filename=f"report-{seed}.pdf",
                    provider_options={"cache": True},
                ),
            ],
        ),
        Message.assistant("checking", tool_calls=calls),
        Message.tool_result(calls[0], "sunny"),
        Message.tool_result(calls[1], "21 C"),
        Message.assistant(f"done {seed}"),
    ]


# ---- every backend ----------------------------------------------------------------------


def test_whole_turn_round_trips_bit_for_bit(memory: ConversationMemory) -> None:
    turn = whole_turn()
    memory.append("conv-1", turn)
    loaded = memory.load("conv-1")
    assert loaded == turn
    sent_parts, got_parts = turn[0].content, loaded[0].content
    assert [type(p) for p in got_parts] == [TextPart, ImagePart, TextPart, FilePart]
    for sent, got in zip(sent_parts[1::2], got_parts[1::2], strict=True):
        assert isinstance(sent, ImagePart | FilePart) and isinstance(got, ImagePart | FilePart)
        assert got.data == sent.data and len(got.data) > 6000
        assert got.mime_type == sent.mime_type
        assert got.provider_options == sent.provider_options
    assert isinstance(got_parts[3], FilePart) and got_parts[3].filename == "report-0.pdf"
    assert loaded[1].tool_calls == turn[1].tool_calls
    assert [m.tool_call_id for m in loaded[2:4]] == ["call-0-a", "call-0-b"]


def test_sync_calls_never_wait_for_the_bridge_loop(memory: ConversationMemory) -> None:
    """With the bridge loop's thread held up, sync load and append still complete: they do
    their I/O on the caller's thread."""
    holding, release = threading.Event(), threading.Event()

    async def hold_the_bridge_loop() -> None:
        holding.set()
        release.wait(30)  # blocks the loop's thread on purpose

    holder = threading.Thread(target=run_sync, args=(hold_the_bridge_loop(),))
    holder.start()
    try:
        assert holding.wait(10)
        loaded: list[list[Message]] = []

        def sync_calls() -> None:
            memory.append("conv-1", [Message.user("q"), Message.assistant("a")])
            loaded.append(memory.load("conv-1", last_turns=1))

        caller = threading.Thread(target=sync_calls)
        caller.start()
        caller.join(20)
        assert loaded == [[Message.user("q"), Message.assistant("a")]]
    finally:
        release.set()
        holder.join(10)


def test_appends_accumulate_in_order(memory: ConversationMemory) -> None:
    turns = [whole_turn(seed) for seed in range(3)]
    for turn in turns:
        memory.append("conv-1", turn)
    assert memory.load("conv-1") == [m for turn in turns for m in turn]


def test_unknown_conversation_loads_empty(memory: ConversationMemory) -> None:
    assert memory.load("never-written") == []


def test_clear_removes_only_that_conversation(memory: ConversationMemory) -> None:
    memory.append("a", [Message.user("in a")])
    memory.append("b", [Message.user("in b")])
    memory.clear("a")
    assert memory.load("a") == []
    assert memory.load("b") == [Message.user("in b")]
    memory.clear("never-written")
    memory.append("a", [Message.user("again")])
    assert memory.load("a") == [Message.user("again")]


def test_stored_history_is_not_shared_with_callers(memory: ConversationMemory) -> None:
    sent = [Message.user("original")]
    memory.append("c", sent)
    sent[0].content.append(TextPart(text="changed after append"))
    loaded = memory.load("c")
    try:
        loaded[0].content.clear()
    except InvalidMessageError as refused:  # Redis hands out shared read-only messages
        assert refused.details["rule"] == "read_only"
    assert memory.load("c") == [Message.user("original")]


def history_with_lead(turn_count: int) -> tuple[list[Message], list[list[Message]]]:
    lead = [
        Message.system("be brief"),
        Message(role=MessageRole.DEVELOPER, content=[TextPart(text="dev")]),
    ]
    # Odd turns carry tool exchanges and attachments; they must move as one block.
    turns = [
        whole_turn(seed) if seed % 2 else [Message.user(f"u{seed}"), Message.assistant(f"a{seed}")]
        for seed in range(turn_count)
    ]
    return lead, turns


@pytest.mark.parametrize("keep", [1, 2, 3, 4, 10])
def test_last_turns_keeps_lead_and_whole_last_turns(memory: ConversationMemory, keep: int) -> None:
    lead, turns = history_with_lead(4)
    memory.append("c", lead + turns[0])
    for turn in turns[1:]:
        memory.append("c", turn)
    everything = lead + [m for turn in turns for m in turn]
    assert memory.load("c", last_turns=keep) == lead + [m for t in turns[-keep:] for m in t]
    assert memory.load("c", last_turns=0) == everything
    assert memory.load("c", last_turns=None) == everything
    assert memory.load("c") == everything  # windowing never trims storage


def test_negative_last_turns_is_a_convoq_error(memory: ConversationMemory) -> None:
    memory.append("c", [Message.user("u")])
    with pytest.raises(ConvoqError, match="last_turns must be >= 0"):
        memory.load("c", last_turns=-1)
    with pytest.raises(ConvoqError, match="keep_last_turns must be >= 0"):
        last_turns([Message.user("u")], -1)


@pytest.mark.parametrize(
    "bad_id", ["", "x" * 257, "a\tb", "a\x00", "\x7f", "\ud800", None, 42, b"bytes-id"], ids=repr
)
async def test_invalid_conversation_id_is_refused_and_changes_nothing(
    memory: ConversationMemory, bad_id: object
) -> None:
    memory.append("kept", [Message.user("stays")])
    for call in (
        lambda: memory.load(bad_id),  # type: ignore[arg-type]
        lambda: memory.append(bad_id, [Message.user("x")]),  # type: ignore[arg-type]
        lambda: memory.clear(bad_id),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidConversationIdError, match="invalid conversation id"):
            call()
    with pytest.raises(InvalidConversationIdError):
        await memory.aload(bad_id)  # type: ignore[arg-type]
    with pytest.raises(InvalidConversationIdError):
        await memory.aappend(bad_id, [Message.user("x")])  # type: ignore[arg-type]
    with pytest.raises(InvalidConversationIdError):
        await memory.aclear(bad_id)  # type: ignore[arg-type]
    assert memory.load("kept") == [Message.user("stays")]


def test_longest_valid_id_works(memory: ConversationMemory) -> None:
    longest = "x" * 256
    memory.append(longest, [Message.user("fits")])
    assert memory.load(longest) == [Message.user("fits")]


@pytest.mark.parametrize(
    "items",
    [[Message.user("ok"), "not a message"], [{"role": "user", "content": []}], "text", None],
    ids=["mixed", "dict", "str", "none"],
)
def test_append_of_non_messages_stores_nothing(memory: ConversationMemory, items: object) -> None:
    with pytest.raises(InvalidMessageError, match="list of Message"):
        memory.append("c", items)  # type: ignore[arg-type]
    assert memory.load("c") == []


async def test_async_flavour(memory: ConversationMemory) -> None:
    first, second = whole_turn(1), whole_turn(2)
    await memory.aappend("c", first)
    assert await memory.aload("c") == first
    memory.append("c", second)  # sync and async calls share one store
    assert await memory.aload("c", last_turns=1) == second
    await memory.aclear("c")
    assert await memory.aload("c") == []
    assert memory.load("c") == []


def run_threads(count: int, target: object) -> None:
    threads = [threading.Thread(target=target, args=(n,)) for n in range(count)]  # type: ignore[arg-type]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def assert_each_once_in_order(messages: list[Message], writers: int, per_writer: int) -> None:
    texts = [m.text for m in messages]
    expected = {f"{w}-{i}" for w in range(writers) for i in range(per_writer)}
    assert Counter(texts) == Counter(expected)
    for writer in range(writers):  # each writer's appends keep their order
        mine = [int(t.split("-")[1]) for t in texts if t.startswith(f"{writer}-")]
        assert mine == list(range(per_writer))


def test_threads_appending_to_one_conversation_lose_nothing(memory: ConversationMemory) -> None:
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(25):
                memory.append("shared", [Message.user(f"{n}-{i}")])
        except BaseException as exc:  # surfaced below; a thread cannot fail the test
            errors.append(exc)

    run_threads(8, writer)
    assert errors == []
    assert_each_once_in_order(memory.load("shared"), 8, 25)


def test_threads_appending_to_own_conversations_lose_nothing(memory: ConversationMemory) -> None:
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(25):
                memory.append(f"conv-{n}", [Message.user(f"{n}-{i}")])
        except BaseException as exc:
            errors.append(exc)

    run_threads(8, writer)
    assert errors == []
    for n in range(8):
        assert [m.text for m in memory.load(f"conv-{n}")] == [f"{n}-{i}" for i in range(25)]


async def test_tasks_appending_concurrently_lose_nothing(memory: ConversationMemory) -> None:
    async def writer(n: int, conversation_id: str) -> None:
        for i in range(25):
            await memory.aappend(conversation_id, [Message.user(f"{n}-{i}")])

    await asyncio.gather(*(writer(n, "shared") for n in range(8)))
    assert_each_once_in_order(await memory.aload("shared"), 8, 25)
    await asyncio.gather(*(writer(n, f"own-{n}") for n in range(8)))
    for n in range(8):
        assert [m.text for m in await memory.aload(f"own-{n}")] == [f"{n}-{i}" for i in range(25)]


# ---- user subclasses of the protocol ------------------------------------------------------


class SyncOnly(ConversationMemory):
    def __init__(self) -> None:
        self.data: dict[str, list[Message]] = {}

    def load(self, conversation_id: str, *, last_turns: int | None = None) -> list[Message]:
        return list(self.data.get(conversation_id, []))

    def append(self, conversation_id: str, messages: list[Message]) -> None:
        self.data.setdefault(conversation_id, []).extend(messages)

    def clear(self, conversation_id: str) -> None:
        self.data.pop(conversation_id, None)


class AsyncOnly(ConversationMemory):
    def __init__(self) -> None:
        self.data: dict[str, list[Message]] = {}

    async def aload(self, conversation_id: str, *, last_turns: int | None = None) -> list[Message]:
        await asyncio.sleep(0)
        return list(self.data.get(conversation_id, []))

    async def aappend(self, conversation_id: str, messages: list[Message]) -> None:
        await asyncio.sleep(0)
        self.data.setdefault(conversation_id, []).extend(messages)

    async def aclear(self, conversation_id: str) -> None:
        self.data.pop(conversation_id, None)


async def test_sync_only_subclass_gets_async_methods() -> None:
    memory = SyncOnly()
    await memory.aappend("c", [Message.user("hi")])
    assert memory.data == {"c": [Message.user("hi")]}
    assert await memory.aload("c") == [Message.user("hi")]
    await memory.aclear("c")
    assert memory.data == {}


def test_async_only_subclass_gets_sync_methods() -> None:
    memory = AsyncOnly()
    memory.append("c", [Message.user("hi")])
    assert memory.data == {"c": [Message.user("hi")]}
    assert memory.load("c") == [Message.user("hi")]
    memory.clear("c")
    assert memory.data == {}


async def test_subclass_with_neither_flavour_says_what_to_implement() -> None:
    class Neither(ConversationMemory):
        pass

    memory = Neither()
    with pytest.raises(NotImplementedError, match="Neither must implement load or aload"):
        memory.load("c")
    with pytest.raises(NotImplementedError, match="implement aload or load"):
        await memory.aload("c")
    with pytest.raises(NotImplementedError, match="implement append or aappend"):
        memory.append("c", [])
    with pytest.raises(NotImplementedError, match="implement aappend or append"):
        await memory.aappend("c", [])
    with pytest.raises(NotImplementedError, match="implement clear or aclear"):
        memory.clear("c")
    with pytest.raises(NotImplementedError, match="implement aclear or clear"):
        await memory.aclear("c")


def test_importing_memory_does_not_import_redis() -> None:
    code = (
        "import sys, convoq.memory as m\n"
        "assert 'RedisConversationMemory' in m.__all__\n"
        "print(sorted(n for n in ('redis', 'convoq.memory.redis') if n in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


# ---- the file backend ---------------------------------------------------------------------


@pytest.fixture
def files(tmp_path: Path) -> FileConversationMemory:
    return FileConversationMemory(tmp_path / "deep" / "er" / "conversations")


def test_file_layout_is_format_2_with_base64_inline(files: FileConversationMemory) -> None:
    assert files.directory.is_dir()  # created with its parents
    turn = whole_turn()
    files.append("user:42", turn)
    path = files.path_for("user:42")
    assert path.parent == files.directory
    assert path.name.startswith("user_42-") and path.suffix == ".json"
    document = json.loads(path.read_bytes())
    assert list(document) == ["format_version", "conversation_id", "messages"]
    assert document["format_version"] == 2
    assert document["conversation_id"] == "user:42"
    image, pdf = document["messages"][0]["content"][1], document["messages"][0]["content"][3]
    sent_image, sent_pdf = turn[0].content[1], turn[0].content[3]
    # The standard base64 alphabet, so any decoder reads the file.
    assert isinstance(sent_image, ImagePart) and isinstance(sent_pdf, FilePart)
    assert base64.b64decode(image["data"], validate=True) == sent_image.data
    assert (image["mime_type"], pdf["mime_type"]) == ("image/png", "application/pdf")
    assert base64.b64decode(pdf["data"], validate=True) == sent_pdf.data
    assert pdf["filename"] == "report-0.pdf"


def test_restart_reads_everything_back_without_the_source_files(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    sources = {
        "photo.jpg": magic_bytes(b"\xff\xd8\xff\xe0", 7),
        "paper.pdf": magic_bytes(b"%PDF-1.4\n", 8),
    }
    for name, data in sources.items():
        (tmp_path / name).write_bytes(data)
    message = Message(
        content=[
            TextPart(text="from disk"),
            load_image(tmp_path / "photo.jpg", provider_options={"detail": "high"}),
            load_pdf(str(tmp_path / "paper.pdf")),
        ]
    )
    FileConversationMemory(directory).append("c", [message, Message.assistant("seen")])
    for name in sources:
        (tmp_path / name).unlink()

    loaded = FileConversationMemory(directory).load("c")
    assert loaded == [message, Message.assistant("seen")]
    image, pdf = loaded[0].content[1], loaded[0].content[2]
    assert isinstance(image, ImagePart) and isinstance(pdf, FilePart)
    assert image.data == sources["photo.jpg"] and image.mime_type == "image/jpeg"
    assert image.provider_options == {"detail": "high"}
    assert pdf.data == sources["paper.pdf"] and pdf.filename == "paper.pdf"


@pytest.mark.parametrize("version", [1, 99, "2", 2.5, None])
def test_other_format_versions_are_refused_with_what_to_do(
    files: FileConversationMemory, version: object
) -> None:
    path = files.path_for("c")
    raw = json.dumps({"format_version": version, "conversation_id": "c", "messages": []})
    path.write_text(raw)
    with pytest.raises(UnsupportedFormatVersionError) as caught:
        files.load("c")
    text = str(caught.value)
    assert f"format_version {version!r}" in text and "format_version 2" in text
    assert "memory.clear('c')" in text and "migrate" in text
    with pytest.raises(UnsupportedFormatVersionError):
        files.append("c", [Message.user("new")])
    assert path.read_text() == raw  # never overwritten
    files.clear("c")
    files.append("c", [Message.user("new")])
    assert files.load("c") == [Message.user("new")]


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"\xff\xfe\x00",
        b"[]",
        b'{"conversation_id": "c", "messages": []}',
        b'{"format_version": 2, "conversation_id": "other", "messages": []}',
        b'{"format_version": 2, "conversation_id": "c", "messages": {}}',
        b'{"format_version": 2, "conversation_id": "c", "messages": [{"role": "nobody"}]}',
        b'{"format_version": 2, "conversation_id": "c", "messages": [{"content":'
        b' [{"type": "image", "data": "!!not base64!!", "mime_type": "image/png"}]}]}',
    ],
    ids=["syntax", "binary", "list", "no-version", "other-id", "dict", "role", "base64"],
)
def test_corrupt_file_names_its_path(files: FileConversationMemory, raw: bytes) -> None:
    path = files.path_for("c")
    path.write_bytes(raw)
    with pytest.raises(CorruptDataError) as caught:
        files.load("c")
    assert str(path) in str(caught.value) and caught.value.details["path"] == str(path)
    with pytest.raises(CorruptDataError):
        files.append("c", [Message.user("new")])
    assert path.read_bytes() == raw


UNSAFE_IDS = [
    "a/b", "a_b", "a:b", "a.b", "..", ".", "x:y", "A", "a", "con", "CON", "nul.txt",
    "../x", "../../etc/passwd", "/abs", "a/../../b", "=+@", "-", "x" * 256, "x" * 255 + "y",
]  # fmt: skip


def test_unsafe_ids_stay_inside_the_directory_and_never_collide(
    files: FileConversationMemory,
) -> None:
    for index, conversation_id in enumerate(UNSAFE_IDS):
        files.append(conversation_id, [Message.user(f"message {index}")])
    for index, conversation_id in enumerate(UNSAFE_IDS):
        assert files.load(conversation_id) == [Message.user(f"message {index}")]
        path = files.path_for(conversation_id)
        assert path.resolve().parent == files.directory.resolve()
        assert not path.name.startswith(".")
    names = [p.name for p in files.directory.iterdir() if p.suffix == ".json"]
    assert len(names) == len(UNSAFE_IDS)
    assert len({name.lower() for name in names}) == len(UNSAFE_IDS)  # case-insensitive FS too
    assert all(p.is_file() for p in files.directory.iterdir())  # no sub-directories
    assert os.listdir(files.directory.parent) == ["conversations"]  # nothing escaped


def test_two_processes_appending_lose_nothing(tmp_path: Path) -> None:
    directory, go = tmp_path / "shared", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    workers = [
        subprocess.Popen(
            [sys.executable, str(APPEND_WORKER), str(directory), "both", str(n), "50", str(go)],
            cwd=REPO,
            env=env,
            stderr=subprocess.PIPE,
        )
        for n in range(2)
    ]
    go.touch()
    for worker in workers:
        _, stderr = worker.communicate(timeout=100)
        assert worker.returncode == 0, stderr.decode()
    assert_each_once_in_order(FileConversationMemory(directory).load("both"), 2, 50)


def test_writes_leave_no_temp_files(files: FileConversationMemory) -> None:
    for seed in range(3):
        files.append("c", whole_turn(seed))
    files.append("d", [Message.user("d")])
    names = sorted(os.listdir(files.directory))
    assert all(name.endswith((".json", ".lock")) for name in names), names
    assert len([n for n in names if n.endswith(".json")]) == 2


def test_failed_write_keeps_the_old_file_and_no_temp_file(
    files: FileConversationMemory, monkeypatch: pytest.MonkeyPatch
) -> None:
    files.append("c", [Message.user("old")])
    before = files.path_for("c").read_bytes()

    def refuse(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(ConversationMemoryError, match="No space left on device"):
        files.append("c", [Message.user("new")])
    monkeypatch.undo()
    assert files.path_for("c").read_bytes() == before
    assert not [n for n in os.listdir(files.directory) if n.endswith(".tmp")]
    assert files.load("c") == [Message.user("old")]


def test_clear_deletes_the_file_and_its_lock(files: FileConversationMemory) -> None:
    files.append("c", [Message.user("x")])
    files.append("keep", [Message.user("y")])
    path = files.path_for("c")
    assert path.exists() and path.with_suffix(".lock").exists()
    files.clear("c")
    assert not path.exists() and not path.with_suffix(".lock").exists()
    assert files.path_for("keep").exists()


def test_max_file_bytes_refuses_growth_and_keeps_history(tmp_path: Path) -> None:
    files = FileConversationMemory(tmp_path, max_file_bytes=4096)
    files.append("c", [Message.user("small")])
    with pytest.raises(ConversationMemoryError, match="max_file_bytes=4096") as caught:
        files.append("c", whole_turn())
    assert "memory.clear('c')" in str(caught.value)
    assert files.load("c") == [Message.user("small")]


def test_unusable_directory_and_bad_limit_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    with pytest.raises(ConversationMemoryError, match="give a writable directory"):
        FileConversationMemory(tmp_path / "a-file")
    with pytest.raises(ConfigurationError, match="max_file_bytes must be a positive int"):
        FileConversationMemory(tmp_path, max_file_bytes=0)
