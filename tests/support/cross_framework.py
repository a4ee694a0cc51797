"""One conversation written in turn by LangChain, the OpenAI Agents SDK, Pydantic AI and a
convoq Agent, each with its own test model (the convoq Agent's speaks one model wire to a
loopback server).

Each side takes a turn the way its framework does it (a user message with an image and a
PDF, a tool call, its result, an answer), records what it wrote in its own terms, and
checks that it reads exactly that back. Every text a turn writes is noted; each later turn
checks its model was given all of it. Fields only a framework knows (message and item
ids, thinking, model names) carry the marker :data:`FRAMEWORK_ONLY`, which no model wire
may send.
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agents import Agent as AgentsAgent
from agents import RunConfig, Runner, function_tool
from agents.items import TResponseInputItem
from agents.testing import ScriptedModel, assistant_message, function_call
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    ToolMessage,
    convert_to_openai_messages,
)
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import capture_run_messages
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.messages import TextPart as PaiText
from pydantic_ai.models.function import AgentInfo, FunctionModel

from convoq import Agent, tool
from convoq.engine import Completed
from convoq.integrations._pydantic_ai_messages import to_pydantic_ai
from convoq.integrations.langchain import ConvoqChatMessageHistory
from convoq.integrations.openai_agents import ConvoqSession
from convoq.integrations.pydantic_ai import durable
from convoq.memory import ConversationMemory
from convoq.messages import FilePart, ImagePart, Message, TextPart
from convoq.models import Model, anthropic, openai, responses
from convoq.profile import TurnJob
from convoq.turn_state import TurnEvent, TurnState
from tests.support import sdk_wire as w
from tests.support.openai_server import OpenAIServer

FRAMEWORK_ONLY = "fw-only"
LEGACY_MIME = b"vnd.convoq.original+json"
WIRES = ["chat", "responses", "anthropic"]
NO_TRACING = RunConfig(tracing_disabled=True)


def png(tag: str) -> bytes:
    """A small PNG-headed image, distinct per ``tag``."""
    return b"\x89PNG\r\n\x1a\n" + tag.encode() + bytes(range(48))


def pdf(tag: str) -> bytes:
    return b"%PDF-1.7\n" + tag.encode() + bytes(range(255, 200, -1))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{b64(data)}"


@dataclass
class Log:
    """What every turn wrote, so a later turn checks its model was given it all."""

    texts: list[str] = field(default_factory=list)
    attachments: list[bytes] = field(default_factory=list)

    def wrote(self, *texts: str, attachments: Sequence[bytes] = ()) -> None:
        self.texts += texts
        self.attachments += attachments

    def given(self, side: str, seen: str) -> None:
        """``seen`` (what ``side``'s model was given) holds every text written so far."""
        missing = [text for text in self.texts if text not in seen]
        assert not missing, f"{side}'s model was not given {missing}"


def in_order(got: Sequence[Any], segments: Sequence[Sequence[Any]], what: str) -> None:
    """Each of ``segments`` is a run of ``got``, in this order."""
    at = 0
    for segment in segments:
        size = len(segment)
        starts = [i for i in range(at, len(got) - size + 1) if list(got[i : i + size]) == segment]
        assert starts, f"{what}: {list(segment)!r} not read back as written; read {list(got)!r}"
        at = starts[0] + size


def question(side: str, n: int) -> str:
    return f"{side} question {n}"


def answer(side: str, n: int) -> str:
    return f"{side} answer {n}"


def tool_result(side: str, n: int) -> str:
    return f"{side} looked up {n}"


class Side(Protocol):
    name: str

    async def take_turn(self, n: int, log: Log) -> None: ...

    async def check_read_back(self) -> None: ...


# -- LangChain ---------------------------------------------------------------------------


class LangChainSide:
    """A LangChain loop over ``ConvoqChatMessageHistory`` with langchain's fake chat model."""

    name = "langchain"

    def __init__(self, memory: ConversationMemory, conversation_id: str) -> None:
        self.history = ConvoqChatMessageHistory(conversation_id, memory)
        self.written: list[list[BaseMessage]] = []

    async def take_turn(self, n: int, log: Log) -> None:
        image, document = png(f"lc{n}"), pdf(f"lc{n}")
        human = HumanMessage(
            content=[
                {"type": "text", "text": question(self.name, n)},
                {"type": "image_url", "image_url": {"url": data_url("image/png", image)}},
                {
                    "type": "file",
                    "source_type": "base64",
                    "mime_type": "application/pdf",
                    "data": b64(document),
                    "filename": f"lc-{n}.pdf",
                },
            ],
            id=f"{FRAMEWORK_ONLY}-lc-human-{n}",
        )
        call = {"name": "lookup", "args": {"q": self.name}, "id": f"lc-call-{n}"}
        model = GenericFakeChatModel(
            messages=iter(
                [
                    AIMessage(
                        "",
                        tool_calls=[call],
                        id=f"{FRAMEWORK_ONLY}-lc-ai-{n}",
                        response_metadata={"model_name": FRAMEWORK_ONLY},
                    ),
                    AIMessage(
                        answer(self.name, n),
                        id=f"{FRAMEWORK_ONLY}-lc-answer-{n}",
                        usage_metadata={"input_tokens": 9, "output_tokens": 2, "total_tokens": 11},
                    ),
                ]
            )
        )
        prompt: list[BaseMessage] = [*await self.history.aget_messages(), human]
        asked = await model.ainvoke(prompt)
        # What LangChain sends an OpenAI model: the history converts without loss of text.
        log.given(self.name, json.dumps(convert_to_openai_messages(prompt)))
        result = ToolMessage(tool_result(self.name, n), tool_call_id=call["id"])
        final = await model.ainvoke([*prompt, asked, result])
        batch = [human, asked, result, final]
        await self.history.aadd_messages(batch)
        self.written.append(batch)
        log.wrote(
            question(self.name, n),
            tool_result(self.name, n),
            answer(self.name, n),
            attachments=[image, document],
        )

    async def check_read_back(self) -> None:
        got = await self.history.aget_messages()
        in_order(got, self.written, "LangChain messages")


# -- OpenAI Agents SDK -------------------------------------------------------------------


class RecordingSession(ConvoqSession):
    """A ConvoqSession that notes each batch of items the SDK adds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.written: list[list[TResponseInputItem]] = []

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        self.written.append(json.loads(json.dumps(items)))
        await super().add_items(items)


@function_tool
def agents_lookup(q: str) -> str:
    """Look something up."""
    return f"openai-agents looked up {q}"


class AgentsSide:
    """The SDK's Runner with a ConvoqSession and the SDK's own ScriptedModel."""

    name = "openai-agents"

    def __init__(self, memory: ConversationMemory, conversation_id: str) -> None:
        self.session = RecordingSession(conversation_id, memory)

    async def take_turn(self, n: int, log: Log) -> None:
        image, document = png(f"oa{n}"), pdf(f"oa{n}")
        model = ScriptedModel(
            [
                [
                    function_call(
                        "agents_lookup",
                        {"q": str(n)},
                        call_id=f"oa-call-{n}",
                        item_id=f"{FRAMEWORK_ONLY}-oa-fc-{n}",
                    )
                ],
                [assistant_message(answer(self.name, n), item_id=f"{FRAMEWORK_ONLY}-oa-msg-{n}")],
            ]
        )
        agent = AgentsAgent(name="assistant", model=model, tools=[agents_lookup])
        user: Any = {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": question(self.name, n)},
                {"type": "input_image", "image_url": data_url("image/png", image), "detail": "low"},
                {
                    "type": "input_file",
                    "file_data": data_url("application/pdf", document),
                    "filename": f"oa-{n}.pdf",
                },
            ],
        }
        result = await Runner.run(agent, [user], session=self.session, run_config=NO_TRACING)
        assert result.final_output == answer(self.name, n)
        assert model.first_call is not None
        log.given(self.name, json.dumps(model.first_call.input, default=str))
        log.wrote(
            question(self.name, n),
            tool_result(self.name, n),
            answer(self.name, n),
            attachments=[image, document],
        )

    async def check_read_back(self) -> None:
        got = await self.session.get_items()
        in_order(got, self.session.written, "OpenAI Agents items")


# -- Pydantic AI -------------------------------------------------------------------------


def pydantic_lookup(q: str) -> str:
    """Look something up."""
    return f"pydantic-ai looked up {q.split()[-1]}"


class PydanticSide:
    """A durable Pydantic AI profile run in process on the memory, as a worker runs it:
    the conversation reserved, its history loaded, the run's messages committed."""

    name = "pydantic-ai"

    def __init__(self, memory: ConversationMemory, conversation_id: str) -> None:
        self.memory = memory
        self.conversation_id = conversation_id
        agent = PydanticAgent(FunctionModel(self._answer), name="pai", tools=[pydantic_lookup])
        self.profile = durable(agent)
        self.written: list[list[ModelMessage]] = []
        self.given: list[str] = []
        self.n = 0

    def _answer(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.given.append(ModelMessagesTypeAdapter.dump_json(messages).decode())
        last = messages[-1]
        if isinstance(last, ModelRequest) and any(
            isinstance(p, ToolReturnPart) and p.tool_call_id == f"pai-call-{self.n}"
            for p in last.parts
        ):
            parts = [ThinkingPart(f"{FRAMEWORK_ONLY} thinking"), PaiText(answer(self.name, self.n))]
            return ModelResponse(parts=parts, model_name=FRAMEWORK_ONLY)
        call = ToolCallPart(
            "pydantic_lookup", {"q": f"{self.name} {self.n}"}, tool_call_id=f"pai-call-{self.n}"
        )
        return ModelResponse(parts=[call], model_name=FRAMEWORK_ONLY)

    async def take_turn(self, n: int, log: Log) -> None:
        self.n, self.given = n, []
        image, document = png(f"pai{n}"), pdf(f"pai{n}")
        user = Message(
            content=[
                TextPart(text=question(self.name, n)),
                ImagePart(data=image, mime_type="image/png"),
                FilePart(data=document, mime_type="application/pdf", filename=f"pai-{n}.pdf"),
            ]
        )
        token = secrets.token_hex(8)
        cid = self.conversation_id
        await self.memory.areserve(cid, token, wait_s=10)
        try:
            history = await self.memory.aload(cid)
            with capture_run_messages() as captured:
                done = await self.profile.run_turn(_job(cid, f"pai-{n}", user, history))
            assert isinstance(done, Completed) and done.text == answer(self.name, n)
            await self.memory.acommit_turn(cid, token, done.messages)
        except BaseException:
            await self.memory.arelease(cid, token)
            raise
        run_id = captured[-1].run_id
        self.written.append([m for m in captured if m.run_id == run_id])
        log.given(self.name, self.given[0])
        log.wrote(
            question(self.name, n),
            tool_result(self.name, n),
            answer(self.name, n),
            attachments=[image, document],
        )

    async def check_read_back(self) -> None:
        got = to_pydantic_ai(await self.memory.aload(self.conversation_id))
        # Equal as Pydantic AI's own JSON form of them (its JSON reads an image back as
        # a BinaryImage, for one).
        in_order(_as_json(got), [_as_json(run) for run in self.written], "Pydantic AI messages")


def _as_json(messages: list[ModelMessage]) -> list[Any]:
    dumped: list[Any] = ModelMessagesTypeAdapter.dump_python(messages, mode="json")
    return dumped


def _job(cid: str, turn_id: str, user: Message, history: list[Message]) -> TurnJob:
    async def emit(event: TurnEvent) -> None:
        return None

    async def checkpoint(state: TurnState) -> None:
        return None

    async def should_stop() -> bool:
        return False

    state = TurnState.start(user)
    return TurnJob(cid, turn_id, "pai", state, history, emit, checkpoint, should_stop)


# -- convoq on a model wire --------------------------------------------------------------


class Wire:
    """A loopback server speaking one model wire, and convoq's model for it."""

    def __init__(self, name: str, server: OpenAIServer) -> None:
        self.name = name
        self.server = server

    def model(self) -> Model:
        if self.name == "chat":
            return openai("gpt-x", base_url=self.server.url, api_key="k", retry_base_delay=0)
        if self.name == "responses":
            return responses("gpt-x", base_url=self.server.url, api_key="k", retry_base_delay=0)
        base = self.server.url.removesuffix("/v1")
        return anthropic("claude-x", base_url=base, api_key="k", retry_base_delay=0)

    def reply_tool_call(self, call_id: str, name: str, arguments: dict[str, Any]) -> None:
        if self.name == "chat":
            self.server.reply_tool_call(name, arguments, id=call_id)
        elif self.name == "responses":
            self.server.reply_raw(
                w.response([w.call_item(call_id, name, arguments)]).model_dump_json()
            )
        else:
            block = w.tool_use_block(call_id, name, arguments)
            self.server.reply_raw(
                w.anthropic_message([block], stop_reason="tool_use").model_dump_json()
            )

    def reply_text(self, text: str) -> None:
        if self.name == "chat":
            self.server.reply_text(text)
        elif self.name == "responses":
            self.server.reply_raw(w.response([w.text_item(text)]).model_dump_json())
        else:
            self.server.reply_raw(w.anthropic_message([w.text_block(text)]).model_dump_json())

    def check(self, body: Any) -> None:
        """``body`` is a valid request of the wire's official SDK."""
        if self.name == "responses":
            w.check_responses_body(body)
        elif self.name == "anthropic":
            w.check_anthropic_body(body)
        else:
            assert isinstance(body, dict) and isinstance(body.get("messages"), list)


def check_sent(wire: Wire, raw: bytes, log: Log) -> None:
    """What a convoq turn sent on ``wire``: a valid request holding every text and every
    attachment written so far, each attachment once, and nothing only a framework knows."""
    wire.check(json.loads(raw))
    assert FRAMEWORK_ONLY.encode() not in raw and LEGACY_MIME not in raw, raw[:2000]
    for data in log.attachments:
        assert raw.count(b64(data).encode()) == 1, f"{data[:12]!r} not sent exactly once"


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return f"convoq looked up {q}"


class ConvoqSide:
    """An in-process convoq Agent whose model speaks ``wire``."""

    name = "convoq"

    def __init__(self, memory: ConversationMemory, conversation_id: str, wire: Wire) -> None:
        self.wire = wire
        self.memory = memory
        self.conversation_id = conversation_id
        self.agent = Agent(wire.model(), "Be brief.", memory=memory, tools=[lookup])
        self.written: list[list[Message]] = []

    async def take_turn(self, n: int, log: Log) -> None:
        image, document = png(f"cq{n}"), pdf(f"cq{n}")
        user = Message(
            content=[
                TextPart(text=question(self.name, n)),
                ImagePart(data=image, mime_type="image/png"),
                FilePart(data=document, mime_type="application/pdf", filename=f"cq-{n}.pdf"),
            ]
        )
        self.wire.reply_tool_call(f"cq-call-{n}", "lookup", {"q": str(n)})
        self.wire.reply_text(answer(self.name, n))
        before = len(self.wire.server.requests)
        response = await self.agent.agenerate(user, conversation_id=self.conversation_id)
        assert response.text == answer(self.name, n)
        sent = [r.body for r in self.wire.server.requests[before:]]
        assert len(sent) == 2
        log.given(self.name, sent[0].decode())
        log.wrote(
            question(self.name, n),
            tool_result(self.name, n),
            answer(self.name, n),
            attachments=[image, document],
        )
        for raw in sent:
            check_sent(self.wire, raw, log)
        self.written.append(list(response.turn))

    async def check_read_back(self) -> None:
        got = await self.memory.aload(self.conversation_id)
        in_order(got, self.written, "convoq messages")


def make_side(name: str, memory: ConversationMemory, conversation_id: str, wire: Wire) -> Side:
    if name == "langchain":
        return LangChainSide(memory, conversation_id)
    if name == "openai-agents":
        return AgentsSide(memory, conversation_id)
    if name == "pydantic-ai":
        return PydanticSide(memory, conversation_id)
    return ConvoqSide(memory, conversation_id, wire)
