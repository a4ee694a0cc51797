"""Retention and erasure: pruning old turns (and their attachments), the idle TTL on Redis
refreshed per turn, the file backend's expiry sweep, delete leaving no key behind, and
export/import of one versioned JSON document between backends (and by the CLI)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from convoq import Agent, Message
from convoq._sync import run_sync
from convoq.cli import app
from convoq.errors import (
    ConversationBusyError,
    ConversationMemoryError,
    ConvoqError,
    CorruptDataError,
    UnsupportedFormatVersionError,
)
from convoq.memory import FileConversationMemory, InMemoryConversationMemory
from convoq.memory.redis import RedisConversationMemory
from convoq.memory.transfer import export_conversation, import_conversation
from convoq.messages import ImagePart, MessageRole, TextPart
from convoq.redis import TurnProtocol
from convoq.redis.keys import KeySchema
from convoq.summary import Summary
from convoq.testing import RecordingModel
from convoq.testing.conformance import sample_turn
from convoq.worker.profiles import Profiles
from convoq.worker.runner import Runner, RunnerConfig

SHARED = b"\x89PNG shared"


def picture_turn(i: int, data: bytes) -> list[Message]:
    user = Message(
        role=MessageRole.USER,
        content=[TextPart(text=f"u{i}"), ImagePart(data=data, mime_type="image/png")],
    )
    return [user, Message.assistant(f"a{i}")]


def conversation() -> list[list[Message]]:
    turns = [picture_turn(i, b"\x89PNG only " + bytes([i])) for i in range(4)]
    turns[0] = picture_turn(0, SHARED)
    turns.append(picture_turn(4, SHARED))  # the same picture again in a kept turn
    return turns


def all_keys(r: redis.Redis, prefix: str) -> list[bytes]:
    return list(r.scan_iter(match=f"{prefix}:*", count=1000))


# ---- prune ------------------------------------------------------------------------------


def test_prune_keeps_the_lead_and_newest_turns_on_every_backend(memory: Any) -> None:
    turns = conversation()
    memory.append("p q", [Message.system("rules")])
    for turn in turns:
        memory.append("p q", turn)
    assert memory.prune("p q", keep_last_turns=2) == 3
    assert memory.load("p q") == [Message.system("rules"), *turns[3], *turns[4]]
    assert memory.prune("p q", keep_last_turns=5) == 0
    assert memory.prune("never stored", keep_last_turns=1) == 0
    with pytest.raises(ConvoqError, match="keep_last_turns must be"):
        memory.prune("p q", keep_last_turns=-1)
    memory.reserve("p q", "running-turn")
    with pytest.raises(ConversationBusyError):
        memory.prune("p q", keep_last_turns=0)
    memory.release("p q", "running-turn")
    assert memory.prune("p q", keep_last_turns=0) == 2
    assert memory.load("p q") == [Message.system("rules")]


async def test_prune_on_redis_drops_blobs_only_dropped_turns_used(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    keys = KeySchema(key_prefix)
    try:
        for turn in conversation():
            await memory.aappend("c", turn)
        assert redis_client.hlen(keys.blobs("c")) == 4
        await memory.aprune("c", keep_last_turns=2)
        left = {k.decode() for k in redis_client.hkeys(keys.blobs("c"))}
        assert left == {
            hashlib.sha256(SHARED).hexdigest(),
            hashlib.sha256(b"\x89PNG only \x03").hexdigest(),
        }
        assert redis_client.hget(keys.meta("c"), "turns") == b"2"
        proto = TurnProtocol.from_url(redis_url, prefix=key_prefix)
        await proto.submit("c", "t1", agent="a", message=Message.user("queued"), options={})
        with pytest.raises(ConversationBusyError):
            await memory.aprune("c", keep_last_turns=0)
        await proto.close()
        assert len(await memory.aload("c")) == 4
    finally:
        await memory.aclose()


# ---- idle TTL on Redis ---------------------------------------------------------------------


async def test_every_key_of_a_conversation_expires_within_its_idle_ttl(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    ttl_s = 600
    proto = TurnProtocol.from_url(redis_url, prefix=key_prefix, conversation_ttl_s=ttl_s)
    runner = Runner(
        proto,
        Profiles([Agent(RecordingModel(), name="a")]),
        RunnerConfig(worker_id="w", lease_ms=5_000),
    )
    memory = RedisConversationMemory(redis_url, prefix=key_prefix, conversation_ttl_s=ttl_s)
    try:
        await memory.aappend("ttl", picture_turn(0, b"\x89PNG x"))
        for tid in ("t1", "t2"):
            await proto.submit(
                "ttl",
                tid,
                agent="a",
                message=Message.user(tid),
                options={},
                idempotency_key=f"k-{tid}",
            )
            await runner.drain("ttl")
        memory.append("ttl", picture_turn(3, b"\x89PNG y"))  # the sync path refreshes it too
        await Agent(RecordingModel(), memory=memory).agenerate("in process", conversation_id="ttl")
        found = all_keys(redis_client, key_prefix)
        kinds = {k.decode().split(":")[2] for k in found}
        assert {"meta", "turns", "blobs", "turn", "events", "idem"} <= kinds
        for key in found:
            assert 0 < redis_client.pttl(key) <= ttl_s * 1000, key
    finally:
        await proto.close()
        await memory.aclose()


async def test_an_idle_conversation_vanishes_whole(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix, conversation_ttl_s=600)
    try:
        await memory.aappend("short", picture_turn(0, b"\x89PNG z"))
        keys = all_keys(redis_client, key_prefix)
        assert keys
        # Every key of it carries the idle lifetime, so all of them go when it runs out;
        # the test runs it out itself (a lifetime of 1 ms) instead of waiting on a short one.
        assert all(0 < redis_client.pttl(key) <= 600_000 for key in keys)
        for key in keys:
            redis_client.pexpire(key, 1)
        for _ in range(100):  # readiness: Redis expires the keys, we only wait for it
            if not all_keys(redis_client, key_prefix):
                break
            await asyncio.sleep(0.05)
        assert all_keys(redis_client, key_prefix) == []
        assert await memory.aload("short") == []
    finally:
        await memory.aclose()


# ---- file expiry sweep -------------------------------------------------------------------


def test_file_expiry_sweep_deletes_only_idle_conversations(tmp_path: Path) -> None:
    files = FileConversationMemory(tmp_path)
    files.append("old one", [Message.user("x")])
    files.append("fresh", [Message.user("y")])
    old = files.path_for("old one")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert files.expire(3600) == 1
    assert files.load("old one") == [] and not old.exists()
    assert files.load("fresh") == [Message.user("y")]
    with pytest.raises(ConvoqError):
        files.expire(0)


# ---- delete --------------------------------------------------------------------------------


async def test_delete_leaves_no_key_or_blob_behind(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    proto = TurnProtocol.from_url(redis_url, prefix=key_prefix)
    runner = Runner(
        proto,
        Profiles([Agent(RecordingModel(), name="a")]),
        RunnerConfig(worker_id="w", lease_ms=5_000),
    )
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    secret = b"\x89PNG personal photo"
    try:
        await memory.aappend("user 42", [Message.system("rules"), *picture_turn(0, secret)])
        await proto.submit(
            "user 42", "t1", agent="a", message=Message.user("hi"), options={}, idempotency_key="k1"
        )
        await runner.drain("user 42")
        await proto.submit("user 42", "t2", agent="a", message=Message.user("queued"), options={})
        await memory.aappend("someone else", [Message.user("stays")])
        assert len(all_keys(redis_client, key_prefix)) > 8
        await memory.adelete("user 42")
        left = [k.decode() for k in all_keys(redis_client, key_prefix)]
        assert left and all(KeySchema(key_prefix).base("someone else") in k for k in left), left
        for key in redis_client.scan_iter(match=f"{key_prefix}:*"):
            if redis_client.type(key) == b"hash":
                assert secret not in redis_client.hvals(key)
        assert await memory.aload("user 42") == []
    finally:
        await proto.close()
        await memory.aclose()


def test_delete_on_the_other_backends(tmp_path: Path) -> None:
    for memory in (InMemoryConversationMemory(), FileConversationMemory(tmp_path)):
        memory.append("gone", sample_turn())
        memory.delete("gone")
        assert memory.load("gone") == []
    assert list(tmp_path.iterdir()) == []


# ---- export / import -------------------------------------------------------------------------


def test_export_import_file_to_redis_and_back(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    files = FileConversationMemory(tmp_path / "a")
    rds = RedisConversationMemory(redis_url, prefix=key_prefix)
    history = [Message.system("rules"), *sample_turn("one"), *sample_turn("two")]
    try:
        files.append("o'brien", history[:5])
        files.append("o'brien", history[5:])
        document = json.loads(export_conversation(files, "o'brien").to_json())
        assert document["format"] == "convoq.conversation" and document["version"] == 1
        assert document["summary"] is None
        assert import_conversation(rds, document) == "o'brien"
        assert rds.load("o'brien") == history
        summary = Summary.of("two looks", watermark=1, version=3)
        _, _, basis = run_sync(files.asummary_state("o'brien"))
        run_sync(files.acommit_summary("o'brien", summary, basis))
        import_conversation(rds, export_conversation(files, "o'brien"), conversation_id="s")
        assert rds.summary("s") == summary and rds.load("s") == history
        back = FileConversationMemory(tmp_path / "b")
        import_conversation(
            back, export_conversation(rds, "o'brien").to_json(), conversation_id="copy"
        )
        assert back.load("copy") == history
        with pytest.raises(ConversationMemoryError, match="already holds"):
            import_conversation(rds, document)
        import_conversation(rds, {**document, "messages": document["messages"][:1]}, replace=True)
        assert rds.load("o'brien") == history[:1]
        with pytest.raises(UnsupportedFormatVersionError):
            import_conversation(rds, {**document, "version": 2}, conversation_id="x")
        with pytest.raises(CorruptDataError):
            import_conversation(rds, b"{}", conversation_id="x")
        assert rds.load("x") == []
    finally:
        rds.close()


def test_cli_export_and_import(tmp_path: Path, redis_url: str, key_prefix: str) -> None:
    env = {"CONVOQ_REDIS_URL": redis_url, "CONVOQ_PREFIX": key_prefix}
    files = FileConversationMemory(tmp_path / "files")
    files.append("from file", sample_turn())
    runner = CliRunner()
    out = tmp_path / "conv.json"
    result = runner.invoke(
        app, ["export", "from file", "--dir", str(tmp_path / "files"), "--out", str(out)], env=env
    )
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["import", str(out), "--conversation-id", "in redis"], env=env)
    assert result.exit_code == 0, result.output
    rds = RedisConversationMemory(redis_url, prefix=key_prefix)
    try:
        assert rds.load("in redis") == sample_turn()
    finally:
        rds.close()
    result = runner.invoke(app, ["export", "in redis"], env=env)
    assert json.loads(result.stdout)["messages"][0]["content"][0]["text"] == "look"
    result = runner.invoke(app, ["import", str(out), "--conversation-id", "in redis"], env=env)
    assert result.exit_code == 1 and "already holds" in result.output
