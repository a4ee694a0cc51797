"""What the cross-framework tests share, and convoq's side of them: a loopback server
speaking one model wire and an in-process convoq Agent whose model speaks it.

Every side (:mod:`tests.support.cross_framework` has the other frameworks') takes a turn
with a user message holding an image and a PDF, a tool call, its result and an answer,
records what it wrote in its own terms and checks it reads exactly that back. Every text
a turn writes is noted in a :class:`Log`; each later turn checks its model was given all
of it. Fields only a framework knows (message and item ids, thinking, model names) carry
the marker :data:`FRAMEWORK_ONLY`, which no model wire may send.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from openai.types.chat import completion_create_params as chat_params
from pydantic import TypeAdapter

from convoq import Agent, tool
from convoq.memory import ConversationMemory
from convoq.messages import FilePart, ImagePart, Message, TextPart
from convoq.models import (
    AnthropicModel,
    OpenAIChatModel,
    OpenAIResponsesModel,
    anthropic,
    openai,
    responses,
)
from tests.support import sdk_wire as w
from tests.support.openai_server import OpenAIServer

_CHAT: dict[bool, TypeAdapter[Any]] = {
    True: TypeAdapter(chat_params.CompletionCreateParamsStreaming),
    False: TypeAdapter(chat_params.CompletionCreateParamsNonStreaming),
}
FRAMEWORK_ONLY = "fw-only"
LEGACY_MIME = b"vnd.convoq.original+json"
WIRES = ["chat", "responses", "anthropic"]


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

    def wrote_turn(self, side: str, n: int, attachments: Sequence[bytes]) -> None:
        """What ``side``'s turn ``n`` wrote: its question, tool result and answer."""
        self.wrote(
            question(side, n), tool_result(side, n), answer(side, n), attachments=attachments
        )

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


def question_message(side: str, n: int, image: bytes, document: bytes, filename: str) -> Message:
    """``side``'s question ``n`` as a convoq message, with an image and a PDF."""
    return Message(
        content=[
            TextPart(text=question(side, n)),
            ImagePart(data=image, mime_type="image/png"),
            FilePart(data=document, mime_type="application/pdf", filename=filename),
        ]
    )


class Side(Protocol):
    name: str

    async def take_turn(self, n: int, log: Log) -> None: ...

    async def check_read_back(self) -> None: ...


# -- convoq on a model wire --------------------------------------------------------------


class Wire:
    """A loopback server speaking one model wire, and convoq's model for it."""

    def __init__(self, name: str, server: OpenAIServer) -> None:
        self.name = name
        self.server = server
        self.models: list[OpenAIChatModel | OpenAIResponsesModel | AnthropicModel] = []

    def model(self) -> OpenAIChatModel | OpenAIResponsesModel | AnthropicModel:
        """convoq's model for the wire, pointed at the server (closed by :meth:`aclose`)."""
        url = self.server.url
        made: OpenAIChatModel | OpenAIResponsesModel | AnthropicModel
        if self.name == "chat":
            made = openai("gpt-x", base_url=url, api_key="k", retry_base_delay=0)
        elif self.name == "responses":
            made = responses("gpt-x", base_url=url, api_key="k", retry_base_delay=0)
        else:
            made = anthropic("claude-x", base_url=url.removesuffix("/v1"), api_key="k",
                             retry_base_delay=0)  # fmt: skip
        self.models.append(made)
        return made

    async def aclose(self) -> None:
        for model in self.models:
            await model.aclose()

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
            w._conforms(_CHAT, body)  # sdk_wire's check, over the SDK's Chat Completions types


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
        user = question_message(self.name, n, image, document, f"cq-{n}.pdf")
        self.wire.reply_tool_call(f"cq-call-{n}", "lookup", {"q": str(n)})
        self.wire.reply_text(answer(self.name, n))
        before = len(self.wire.server.requests)
        response = await self.agent.agenerate(user, conversation_id=self.conversation_id)
        assert response.text == answer(self.name, n)
        sent = [r.body for r in self.wire.server.requests[before:]]
        assert len(sent) == 2
        log.given(self.name, sent[0].decode())
        log.wrote_turn(self.name, n, [image, document])
        for raw in sent:
            check_sent(self.wire, raw, log)
        self.written.append(list(response.turn))

    async def check_read_back(self) -> None:
        got = await self.memory.aload(self.conversation_id)
        in_order(got, self.written, "convoq messages")
