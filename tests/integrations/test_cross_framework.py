"""One conversation passes between LangChain, the OpenAI Agents SDK, Pydantic AI and convoq
agents in any order, with convoq's model on every wire (Chat Completions, Responses,
Anthropic; loopback servers) and on the in-memory, file and Redis backends: every model is
given everything written before it, no wire sends what only a framework keeps, each
attachment is stored once, and each framework reads back exactly what it wrote. Messages
stored in the earlier form (the framework's JSON as a last file part) still load."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from langchain_core.messages import HumanMessage

from convoq import Agent
from convoq._sync import run_sync
from convoq.errors import CorruptDataError
from convoq.integrations.langchain import ConvoqChatMessageHistory
from convoq.integrations.openai_agents import ConvoqSession
from convoq.memory import ConversationMemory, InMemoryConversationMemory
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import FilePart, ImagePart, Message, MessageRole, TextPart, ToolCall
from convoq.models import ModelRequest
from convoq.redis.keys import KeySchema
from tests.support import legacy_records as legacy
from tests.support.cross_framework import AgentsSide, LangChainSide, make_side
from tests.support.cross_framework_wire import (
    FRAMEWORK_ONLY,
    LEGACY_MIME,
    WIRES,
    Log,
    Wire,
    b64,
    check_sent,
)
from tests.support.memory_backends import backend_url, close_memory, make_memory
from tests.support.openai_server import OpenAIServer
from tests.support.redis_server import RedisServer
from tests.support.workers import running_pool

FRAMEWORKS = ["langchain", "openai-agents", "pydantic-ai", "convoq"]
# Four orders in which each framework goes first once and follows each other one once
# (all twelve ordered pairs).
PAIRWISE = [
    ["langchain", "openai-agents", "pydantic-ai", "convoq"],
    ["openai-agents", "convoq", "langchain", "pydantic-ai"],
    ["pydantic-ai", "langchain", "convoq", "openai-agents"],
    ["convoq", "pydantic-ai", "openai-agents", "langchain"],
]
# Every order in memory; the pairwise orders on the file and Redis backends.
CASES = [("in_memory", list(order)) for order in itertools.permutations(FRAMEWORKS)] + [
    (backend, order) for backend in ("file", "redis") for order in PAIRWISE
]


@dataclass
class Store:
    """A memory of one backend and a look at the bytes it keeps."""

    backend: str
    memory: ConversationMemory
    tmp_path: Path
    redis_url: str | None
    prefix: str

    def raw(self, cid: str) -> tuple[bytes, list[bytes]]:
        """The conversation's stored bytes: its records, and (Redis) its blobs."""
        if isinstance(self.memory, InMemoryConversationMemory):
            return b"".join(self.memory._chunks[cid]), []
        if self.backend == "file":
            files = sorted((self.tmp_path / "conversations").rglob("*"))
            return b"".join(f.read_bytes() for f in files if f.is_file()), []
        keys = KeySchema(self.prefix)
        with redis.Redis.from_url(str(self.redis_url)) as client:
            elements = client.lrange(keys.lead(cid), 0, -1) + client.lrange(keys.turns(cid), 0, -1)
            blobs = list(client.hgetall(keys.blobs(cid)).values())
        return b"".join(elements), blobs

    def check_stored_once(self, cid: str, attachments: list[bytes]) -> None:
        """Each attachment's bytes are stored once (no framework record holds a copy)."""
        records, blobs = self.raw(cid)
        for data in attachments:
            in_records = records.count(b64(data).encode())
            assert in_records + blobs.count(data) == 1, (self.backend, data[:16])


@pytest.fixture
def store(request: pytest.FixtureRequest, tmp_path: Path, key_prefix: str) -> Iterator[Store]:
    backend = request.param
    url = backend_url(request, backend)
    made = make_memory(backend, tmp_path, url, key_prefix)
    yield Store(backend, made, tmp_path, url, key_prefix)
    close_memory(made)


@pytest.fixture(params=WIRES)
async def wire(request: pytest.FixtureRequest) -> AsyncIterator[Wire]:
    with OpenAIServer() as server:
        made = Wire(request.param, server)
        yield made
        await made.aclose()


@pytest.mark.parametrize(
    ("store", "order"), CASES, indirect=["store"], ids=[f"{b}-{'>'.join(o)}" for b, o in CASES]
)
async def test_one_conversation_passes_between_frameworks(
    store: Store, order: list[str], wire: Wire
) -> None:
    cid = f"cross-{uuid.uuid4().hex[:8]}"
    sides = {name: make_side(name, store.memory, cid, wire) for name in FRAMEWORKS}
    log = Log()
    # Every framework in this order, then convoq once more: its model is given it all.
    for n, name in enumerate([*order, "convoq"], start=1):
        await sides[name].take_turn(n, log)
    for side in sides.values():
        await side.check_read_back()
    store.check_stored_once(cid, log.attachments)


@pytest.mark.parametrize("store", ["in_memory", "file", "redis"], indirect=True)
async def test_conversations_stored_in_the_earlier_form_still_load(
    store: Store, wire: Wire
) -> None:
    cid = f"legacy-{uuid.uuid4().hex[:8]}"
    await store.memory.aappend(cid, legacy.stored_messages())
    records, blobs = store.raw(cid)
    assert LEGACY_MIME in records + b"".join(blobs)  # stored as the earlier convoq did
    loaded = await store.memory.aload(cid)
    assert [list(m.framework or {}) for m in loaded] == [["langchain"]] * 4 + [
        ["openai-agents"], ["openai-agents"], [], ["openai-agents"]
    ]  # fmt: skip
    assert not any(isinstance(p, FilePart) and p.mime_type == legacy.LEGACY_MIME
                   for m in loaded for p in m.content)  # fmt: skip
    history = ConvoqChatMessageHistory(cid, store.memory)
    assert (await history.aget_messages())[:4] == legacy.langchain_messages()
    assert (await ConvoqSession(cid, store.memory).get_items())[-4:] == legacy.agents_items()
    # A convoq agent continues it on the wire; then LangChain does, and reads it all back.
    log = Log()
    log.wrote("legacy langchain answer", "legacy agents answer", attachments=[legacy.PNG])
    wire.reply_text("convoq answer")
    agent = Agent(wire.model(), "Be brief.", memory=store.memory)
    assert (await agent.agenerate("and now?", conversation_id=cid)).text == "convoq answer"
    [sent] = wire.server.requests
    assert sent.body.count(b64(legacy.PNG).encode()) == 2  # one per user message
    assert sent.body.count(b64(legacy.PDF).encode()) == 2
    check_sent(wire, sent.body, Log())
    log.given("convoq", sent.body.decode())
    await history.aadd_messages([HumanMessage("thanks", id="lc-h-2")])
    read = await history.aget_messages()
    assert read[:4] == legacy.langchain_messages() and read[-1] == HumanMessage(
        "thanks", id="lc-h-2"
    )


def history_with_framework_records() -> list[Message]:
    """Every role, with an image and a PDF, each message keeping a framework record."""
    call = ToolCall(id="call_1", name="lookup", arguments={"q": "x"})
    kept = {"some-framework": {"id": f"{FRAMEWORK_ONLY}-id", "extra": [FRAMEWORK_ONLY]}}
    messages = [
        Message.system("Be brief."),
        Message(
            content=[
                TextPart(text="look"),
                ImagePart(data=b"\x89PNG\r\n\x1a\nimg", mime_type="image/png"),
                FilePart(data=b"%PDF-1.7 doc", mime_type="application/pdf", filename="a.pdf"),
            ]
        ),
        Message.assistant("Looking.", [call]),
        Message.tool_result(call, "found"),
        Message(role=MessageRole.ASSISTANT),  # an item convoq has no counterpart for
        Message.assistant("Done."),
        Message.user("thanks"),
    ]
    return [m.model_copy(update={"framework": kept}) for m in messages]


async def test_no_model_wire_sends_framework_records(wire: Wire) -> None:
    with_records = history_with_framework_records()
    without = [m.model_copy(update={"framework": None}) for m in with_records]
    model = wire.model()
    for messages in (with_records, without):
        wire.reply_text("ok")
        await model.request(ModelRequest(messages=messages))
    sent, plain = wire.server.requests
    assert FRAMEWORK_ONLY.encode() not in sent.body
    assert sent.json == plain.json  # the records change nothing that is sent
    wire.check(sent.json)


def test_a_worker_continues_a_langchain_and_openai_agents_conversation_on_every_wire(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    servers = {name: OpenAIServer() for name in WIRES}
    with servers["chat"], servers["responses"], servers["anthropic"]:
        monkeypatch.setenv("TEST_CHAT_URL", servers["chat"].url)
        monkeypatch.setenv("TEST_RESPONSES_URL", servers["responses"].url)
        monkeypatch.setenv("TEST_ANTHROPIC_URL", servers["anthropic"].url.removesuffix("/v1"))
        wires = [Wire(name, server) for name, server in servers.items()]
        for wire in wires:
            wire.reply_text(f"{wire.name} answer")
        profiles = "tests.support.cross_framework_agents"
        with running_pool(redis_server.url, tmp_path, 1, agents=profiles) as pool:
            memory = RedisConversationMemory(redis_server.url, prefix=pool.prefix)
            try:
                cid = f"lc-worker-{uuid.uuid4().hex[:8]}"
                langchain, log = LangChainSide(memory, cid), Log()
                agents = AgentsSide(memory, cid)
                run_sync(langchain.take_turn(1, log))
                run_sync(agents.take_turn(2, log))
                with pool.client() as client:
                    for wire in wires:  # one turn on each wire, each given all before it
                        handle = client.submit(
                            cid, f"{wire.name} question", agent=f"xf-{wire.name}"
                        )
                        assert handle.wait(60).text == f"{wire.name} answer"
                        [sent] = wire.server.requests
                        check_sent(wire, sent.body, log)
                        log.given(f"the worker's {wire.name} turn", sent.body.decode())
                        log.wrote(f"{wire.name} question", f"{wire.name} answer")
                run_sync(langchain.check_read_back())
                run_sync(agents.check_read_back())
                roles = [m.role for m in memory.load(cid)]
                assert roles[-6:] == [MessageRole.USER, MessageRole.ASSISTANT] * 3
            finally:
                memory.close()


async def test_an_earlier_record_that_does_not_parse_is_reported() -> None:
    memory = InMemoryConversationMemory()
    damaged = FilePart(data=b"not json", mime_type=legacy.LEGACY_MIME)
    view = Message.assistant("kept")
    memory.append(
        "c", [Message.user("hi"), view.model_copy(update={"content": [*view.content, damaged]})]
    )
    [_, stored] = memory.load("c")
    assert stored.content == view.content  # convoq's own view loads, and no wire sends it
    with pytest.raises(CorruptDataError, match="not JSON"):
        await ConvoqSession("c", memory).get_items()
    with pytest.raises(CorruptDataError, match="not JSON"):
        await ConvoqChatMessageHistory("c", memory).aget_messages()
