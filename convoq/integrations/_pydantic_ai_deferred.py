"""A parked Pydantic AI run on convoq's continuation record, and the results it resumes
with. A tool that requires approval waits for a person (``approve``/``deny``); a tool that
raises Pydantic AI's ``CallDeferred`` waits for its result from outside
(``complete_call``), as a convoq tool raising :class:`~convoq.CallDeferred` does: its
``metadata`` is shown with the waiting call, and its deadline is the profile's approval
expiry (Pydantic AI's CallDeferred has no timeout of its own). On resume, Pydantic AI gets
each approval as ``approvals`` and each result as ``calls``: the result's text (what a
convoq tool's model would read), or ``ToolFailed`` with the error (an error result, or
the deadline passed)."""

from __future__ import annotations

from typing import Any

from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolDenied
from pydantic_ai.exceptions import ToolFailed
from pydantic_core import to_jsonable_python

from convoq.approvals import refused_result
from convoq.engine import EventSink, Paused
from convoq.messages import Message, ToolCall
from convoq.turn_state import TurnEvent, TurnState, Wait
from convoq.waits import supplied_text, wait_data


async def parked(
    requests: DeferredToolRequests, messages: list[Message], steps: int, emit: EventSink
) -> Paused:
    """The paused turn of a run that ended with ``requests``: its calls waiting for a
    result, then those waiting for approval; an event for each."""
    waits = {
        c.tool_call_id: Wait(on="result", metadata=_metadata(requests.metadata.get(c.tool_call_id)))
        for c in requests.calls
    }
    pending = [
        ToolCall(id=c.tool_call_id, name=c.tool_name, arguments=c.args_as_dict())
        for c in [*requests.calls, *requests.approvals]
    ]
    for call in pending:
        wait = waits.get(call.id)
        if wait is None:
            await emit(TurnEvent(type="approval_required", data=call.model_dump()))
        else:
            await emit(TurnEvent(type="deferred", data=wait_data(call, wait)))
    return Paused(TurnState(messages=messages, steps=steps, pending=pending, waits=waits))


def deferred_results(state: TurnState) -> DeferredToolResults | None:
    """The decisions and results a parked turn resumes with, as Pydantic AI's."""
    if not state.decisions:
        return None
    approvals: dict[str, bool | ToolDenied] = {}
    calls: dict[str, Any] = {}
    for call_id, decision in state.decisions.items():
        wait = state.waits.get(call_id)
        if wait is not None:
            text, is_error = supplied_text(wait, decision)
            calls[call_id] = ToolFailed(text) if is_error else text
        else:
            approvals[call_id] = True if decision.approved else ToolDenied(refused_result(decision))
    return DeferredToolResults(approvals=dict(approvals), calls=calls)


def _metadata(value: Any) -> dict[str, Any]:
    data = to_jsonable_python(value or {}, fallback=str)
    return data if isinstance(data, dict) else {"value": data}
