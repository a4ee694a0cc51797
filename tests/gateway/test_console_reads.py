"""What the console reads of the store, on a real Redis without workers: transcript pages
(newest first, a turn stored in several elements kept whole, the leading system messages
on the last page, attachments by reference with their size), conversations and turns
found by SCAN under a prefix (and a SCAN stopped at its bound says so), the backlog of the
inboxes, and the timeline of a turn built from its events."""

from __future__ import annotations

import hashlib

import pytest

from convoq.context import idempotency_key
from convoq.gateway.console_models import TurnDetail
from convoq.gateway.timeline import timeline
from convoq.ids import new_turn_id
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import ImagePart, Message, TextPart, ToolCall
from convoq.redis import TurnProtocol
from convoq.redis._browse import Browse, ScanBound, created_ms_of
from convoq.redis._inspect import Inspect
from convoq.redis._transcript import Transcript
from convoq.turn_state import TurnEvent

PNG = b"\x89PNG\r\n\x1a\n" + b"0" * 40


@pytest.fixture
def protocol_url(store_url: str) -> str:
    """Each test runs on one redis-server and again on the Redis Cluster (every read of a
    conversation stays in its slot; SCAN visits every primary)."""
    return store_url


def _memory(url: str, key_prefix: str) -> RedisConversationMemory:
    return RedisConversationMemory(url, prefix=key_prefix)


async def test_transcript_pages_newest_first_keeping_turns_whole(
    proto: TurnProtocol, protocol_url: str, key_prefix: str
) -> None:
    memory = _memory(protocol_url, key_prefix)
    cid = "paged"
    await memory.aappend(cid, [Message.system("be brief")])
    picture = Message(content=[TextPart(text="look"), ImagePart(data=PNG, mime_type="image/png")])
    await memory.aappend(cid, [picture, Message.assistant("a picture")])
    for n in range(2, 5):
        await memory.aappend(cid, [Message.user(f"q{n}"), Message.assistant(f"a{n}")])
    # The last turn goes on in an element of its own (stored after the turn began).
    await memory.aappend(cid, [Message.assistant("and more")])
    reader = Transcript(proto.redis, proto.keys)

    first = await reader.page(cid, before=None, limit=2)
    assert first.total == 5
    assert [m["content"][0]["text"] for m in first.turns[0].messages] == ["q4", "a4", "and more"]
    assert len(first.turns) == 1 and first.next_before == 3  # the page's start continued
    assert first.lead == []
    second = await reader.page(cid, before=first.next_before, limit=2)
    assert [t.messages[0]["content"][0]["text"] for t in second.turns] == ["q3", "q2"]
    last = await reader.page(cid, before=second.next_before, limit=2)
    assert last.next_before is None and [t.index for t in last.turns] == [0]
    user = last.turns[0].messages[0]
    sha = hashlib.sha256(PNG).hexdigest()
    assert user["content"][1] == {
        "type": "image", "mime_type": "image/png", "filename": None, "sha256": sha, "size": len(PNG)
    }  # fmt: skip
    assert [m["content"][0]["text"] for m in last.lead] == ["be brief"]
    assert await reader.attachment(cid, sha) == PNG
    past = await reader.page(cid, before=99, limit=2)  # past the end: the newest page
    assert past == first
    with pytest.raises(ValueError, match="before must be 1 or more"):
        await reader.page(cid, before=0, limit=2)


async def test_conversations_and_turns_are_found_under_a_prefix(
    proto: TurnProtocol, key_prefix: str
) -> None:
    ids = {cid: [new_turn_id() for _ in range(3)] for cid in ("a:one", "a:two", "b:one", "a*")}
    for cid, tids in ids.items():
        for tid in tids:
            await proto.submit(cid, tid, agent="bot", message=Message.user(tid), options={})
    browse = Browse(proto.redis, proto.keys)
    found = await browse.conversations("a:")
    assert found.complete and set(found.found) == {"a:one", "a:two"}
    assert found.found["a:one"].turn_ids == set(ids["a:one"])
    assert "inbox" in found.found["a:one"].kinds
    # A glob character in an id is encoded: it matches only itself.
    assert set((await browse.conversations("a*")).found) == {"a*"}
    assert set((await browse.conversations()).found) == set(ids)
    newest_first, complete = await browse.turn_ids("b:one")
    assert complete and newest_first == sorted(ids["b:one"], reverse=True)
    assert created_ms_of(newest_first[0]) is not None and created_ms_of("custom") is None

    stopped = await Browse(proto.redis, proto.keys, ScanBound(max_keys=2)).conversations()
    assert stopped.complete is False and len(stopped.found) <= 2

    backlog = await browse.backlog(lambda cid: 0 if cid.startswith("a") else 1, "a:")
    assert backlog.queued == {0: 6} and backlog.running == {} and backlog.complete
    briefs = await Inspect(proto.redis, proto.keys).briefs([("a:one", ids["a:one"][0]),
                                                            ("a:one", "gone")])  # fmt: skip
    assert [(b.turn_id, b.status) for b in briefs] == [(ids["a:one"][0], "queued")]


async def test_a_timeline_reads_steps_from_events_and_keys_from_messages(
    proto: TurnProtocol,
) -> None:
    cid, tid = "timed", new_turn_id()
    await proto.submit(cid, tid, agent="bot", message=Message.user("go"), options={
        "model_settings": {"temperature": 0.2}, "metadata": {"who": "Ada"}})  # fmt: skip
    call = ToolCall(id="c1", name="look", arguments={"q": 1})
    events = [
        TurnEvent(type="status", data={"status": "running"}),
        TurnEvent(type="text_delta", data={"text": "thinking"}),
        TurnEvent(type="assistant", data={"text": "", "model": "m", "latency_ms": 12,
                                          "finish_reason": "tool_calls", "worker": "h:1"}),
        TurnEvent(type="tool_call", data={**call.model_dump(), "worker": "h:1"}),
        TurnEvent(type="resumed", data={"reason": "worker_lost", "attempt": 2}),
        TurnEvent(type="tool_call", data={**call.model_dump(), "worker": "h:2"}),
        TurnEvent(type="tool_result", data={"id": "c1", "name": "look", "result": "found"}),
        TurnEvent(type="retried", data={"retry": 1}),
    ]  # fmt: skip
    for event in events:
        await proto.emit(cid, tid, event)
    whole = await Inspect(proto.redis, proto.keys).whole(cid, tid)
    assert whole is not None
    steps = timeline(whole)
    assert [s.kind for s in steps] == ["status", "run", "model_call", "tool_call", "resumed",
                                       "event"]  # fmt: skip
    model, tool = steps[2], steps[3]
    assert (model.model, model.latency_ms, model.settings) == ("m", 12, {"temperature": 0.2})
    assert (tool.runs, tool.worker, tool.result, tool.step) == (2, "h:2", "found", 1)
    # No stored messages to find the call in: the model calls counted from the events.
    assert tool.idempotency_key == idempotency_key(cid, tid, 1, "c1")
    assert steps[-1].type == "retried" and steps[-1].data == {"retry": 1}
    assert all(s.at_ms and s.at_ms > 0 for s in steps)
    detail = TurnDetail.of(whole.record, steps, whole.events[-1][0])
    assert detail.options == {"model_settings": {"temperature": 0.2}}  # metadata apart
    assert detail.metadata == {"who": "Ada"}


def test_a_scan_is_bounded_by_default() -> None:
    assert ScanBound() == ScanBound(max_keys=200_000, max_s=2.0)
