"""The step journal of a Pydantic AI run on a worker.

Like Pydantic AI's own durable integrations, it works through the framework's public
seams: a capability (:class:`JournalCapability`) wraps the run's model in a
:class:`~pydantic_ai.models.wrapper.WrapperModel` (text deltas to the turn's events) and
its toolset in a :class:`~pydantic_ai.toolsets.WrapperToolset`, and hears of each model
response. Each model response and each tool result is handed to convoq's fenced
``checkpoint`` before the run goes on, as the turn's messages so far (converted by
:mod:`._pydantic_ai_messages`). A rerun continues the run from those messages; a tool call
whose result was journaled before its response's other calls finished returns that result
instead of running again.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from pydantic_ai import ModelRetry
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    PartDeltaEvent,
    PartStartEvent,
    TextPartDelta,
)
from pydantic_ai.messages import (
    TextPart as PaiText,
)
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import RunContext
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool, WrapperToolset
from pydantic_core import to_jsonable_python

from convoq.errors import TurnCancelledError
from convoq.integrations._pydantic_ai_messages import KEY, is_journal_entry, to_convoq
from convoq.messages import Message, MessageRole, TextPart, ToolCall
from convoq.profile import TurnJob
from convoq.turn_state import TurnEvent, TurnState


class TurnJournal:
    """What one run of a turn has journaled: ``base`` (the turn's messages from earlier
    runs), ``segment`` (this run's, converted at its last model response) and the tool
    results journaled since (``entries``, by call id)."""

    def __init__(self, job: TurnJob, base: list[Message], history_len: int) -> None:
        self.job = job
        self.base = base
        self.history_len = history_len
        self.segment: list[Message] = []
        self.entries = {m.tool_call_id: m for m in job.state.messages if is_journal_entry(m)}
        self.steps = job.state.steps
        # The decisions this run resumed with stay journaled until a response follows them,
        # so a rerun before that resumes with them again.
        self.pending = list(job.state.pending)
        self.decisions = dict(job.state.decisions)
        # Recorded on their tool results (the audit trail) whenever the run is converted.
        self.audit = dict(job.state.decisions)
        self._lock = asyncio.Lock()

    @property
    def messages(self) -> list[Message]:
        return self.base + self.segment

    def state(self) -> TurnState:
        answered = {m.tool_call_id for m in self.messages if m.role == MessageRole.TOOL}
        waiting = [e for i, e in self.entries.items() if i not in answered]
        return TurnState(
            messages=self.messages + waiting,
            steps=self.steps,
            pending=self.pending,
            decisions=self.decisions,
        )

    async def go_on(self) -> None:
        """Before each step: a turn cancelled meanwhile stops here (nothing is stored)."""
        if await self.job.should_stop():
            raise TurnCancelledError("the turn was cancelled")

    async def responded(self, run_messages: list[ModelMessage]) -> None:
        """A model response arrived (the last of ``run_messages``, this run's messages)."""
        async with self._lock:
            self.segment = to_convoq(run_messages, self.audit)
            self.steps += 1
            self.pending, self.decisions = [], {}
            await self.job.checkpoint(self.state())
        reply = self.segment[-1]
        data: dict[str, Any] = {"text": reply.text, "finish_reason": reply.finish_reason}
        if reply.usage is not None:
            data["usage"] = reply.usage.model_dump()
        await self.job.emit(TurnEvent(type="assistant", data=data))

    def recorded(self, call_id: str) -> dict[str, Any] | None:
        entry = self.entries.get(call_id)
        if entry is None or entry.framework is None:
            return None
        recorded: dict[str, Any] = entry.framework[KEY]["journal"]
        return recorded

    async def tool_done(self, call: ToolCall, outcome: dict[str, Any], text: str) -> None:
        """A tool call ended (``outcome``: its JSON return value, or the retry it asked for)."""
        entry = Message(
            role=MessageRole.TOOL,
            content=[TextPart(text=text)],
            tool_call_id=call.id,
            name=call.name,
            framework={KEY: {"journal": outcome}},
        )
        async with self._lock:
            self.entries[call.id] = entry
            await self.job.checkpoint(self.state())
        data = {"id": call.id, "name": call.name, "result": text}
        await self.job.emit(TurnEvent(type="tool_result", data=data))


@dataclass
class JournaledToolset(WrapperToolset[Any]):
    """Runs each tool call at most once per journal entry: a journaled result is returned
    (a journaled retry raised again) instead of calling the tool. (A dataclass, as the
    framework copies toolsets with ``dataclasses.replace`` for each run.)"""

    journal: TurnJournal

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        call_id = ctx.tool_call_id or ""
        recorded = self.journal.recorded(call_id)
        if recorded is not None:
            if "retry" in recorded:
                raise ModelRetry(recorded["retry"])
            return recorded["return"]
        await self.journal.go_on()
        call = ToolCall(id=call_id, name=name, arguments=tool_args)
        await self.journal.job.emit(TurnEvent(type="tool_call", data=call.model_dump()))
        try:
            result = await super().call_tool(name, tool_args, ctx, tool)
        except ModelRetry as retry:
            await self.journal.tool_done(call, {"retry": retry.message}, retry.message)
            raise
        value = to_jsonable_python(result)
        text = value if isinstance(value, str) else to_json_text(value)
        await self.journal.tool_done(call, {"return": value}, text)
        return value


def to_json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


class StreamingModel(WrapperModel):
    """Sends each request streamed when the model can, so its text deltas reach the
    turn's events as they come; the agent still gets the whole response."""

    def __init__(self, wrapped: Model, journal: TurnJournal, *, stream: bool) -> None:
        super().__init__(wrapped)
        self._journal = journal
        self._stream = stream

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        await self._journal.go_on()
        if not self._stream:
            return await super().request(messages, model_settings, model_request_parameters)
        wrapped = self.wrapped.request_stream(messages, model_settings, model_request_parameters)
        async with wrapped as stream:
            async for event in stream:
                text = _delta_text(event)
                if text:
                    await self._journal.job.emit(TurnEvent(type="text_delta", data={"text": text}))
            return stream.get()


def _delta_text(event: Any) -> str:
    if isinstance(event, PartStartEvent) and isinstance(event.part, PaiText):
        return event.part.content
    if isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
        return event.delta.content_delta
    return ""


def streams(model: Model) -> bool:
    """Whether the model can stream (a FunctionModel only with a stream function; any
    other model that implements ``request_stream``)."""
    if isinstance(model, FunctionModel):
        return model.stream_function is not None
    return type(model).request_stream is not Model.request_stream


class JournalCapability(AbstractCapability[Any]):
    """The journal's hooks into one run."""

    def __init__(self, journal: TurnJournal) -> None:
        self._journal = journal

    def get_wrapper_model(self, model: Model) -> Model | None:
        return StreamingModel(model, self._journal, stream=streams(model))

    def get_wrapper_toolset(self, toolset: AbstractToolset[Any]) -> AbstractToolset[Any] | None:
        return JournaledToolset(toolset, journal=self._journal)

    async def after_model_request(
        self, ctx: RunContext[Any], *, request_context: Any, response: ModelResponse
    ) -> ModelResponse:
        run_messages = list(ctx.messages[self._journal.history_len :])
        if not run_messages or run_messages[-1] is not response:
            run_messages.append(response)
        await self._journal.responded(run_messages)
        return response
