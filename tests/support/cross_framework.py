"""LangChain, the OpenAI Agents SDK and Pydantic AI as sides of one conversation (see
:mod:`tests.support.cross_framework_wire` for what the sides share and convoq's side).

LangChain loops over ``ConvoqChatMessageHistory`` with its fake chat model; the OpenAI
Agents SDK runs with a ``ConvoqSession`` and its own ScriptedModel; Pydantic AI runs as a
durable profile in process, as a worker runs it, with its FunctionModel.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

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

from convoq.engine import Completed
from convoq.integrations._pydantic_ai_messages import to_pydantic_ai
from convoq.integrations.langchain import ConvoqChatMessageHistory
from convoq.integrations.openai_agents import ConvoqSession
from convoq.integrations.pydantic_ai import durable
from convoq.memory import ConversationMemory
from convoq.messages import Message
from convoq.profile import TurnJob
from convoq.turn_state import TurnEvent, TurnState
from tests.support.cross_framework_wire import (
    FRAMEWORK_ONLY,
    ConvoqSide,
    Log,
    Side,
    Wire,
    answer,
    b64,
    data_url,
    in_order,
    pdf,
    png,
    question,
    question_message,
    tool_result,
)

NO_TRACING = RunConfig(tracing_disabled=True)


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
        log.wrote_turn(self.name, n, [image, document])

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
        log.wrote_turn(self.name, n, [image, document])

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
            parts: list[Any] = [ThinkingPart(f"{FRAMEWORK_ONLY} thinking")]
            parts.append(PaiText(answer(self.name, self.n)))
            return ModelResponse(parts=parts, model_name=FRAMEWORK_ONLY)
        call = ToolCallPart(
            "pydantic_lookup", {"q": f"{self.name} {self.n}"}, tool_call_id=f"pai-call-{self.n}"
        )
        return ModelResponse(parts=[call], model_name=FRAMEWORK_ONLY)

    async def take_turn(self, n: int, log: Log) -> None:
        self.n, self.given = n, []
        image, document = png(f"pai{n}"), pdf(f"pai{n}")
        user = question_message(self.name, n, image, document, f"pai-{n}.pdf")
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
        log.wrote_turn(self.name, n, [image, document])

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


def make_side(name: str, memory: ConversationMemory, conversation_id: str, wire: Wire) -> Side:
    if name == "langchain":
        return LangChainSide(memory, conversation_id)
    if name == "openai-agents":
        return AgentsSide(memory, conversation_id)
    if name == "pydantic-ai":
        return PydanticSide(memory, conversation_id)
    return ConvoqSide(memory, conversation_id, wire)
