"""The turn loop resumes from any checkpoint without repeating finished steps."""

from __future__ import annotations

import pytest

from convoq import Message, ToolCall, tool
from convoq.engine import Completed, Paused, TurnLoop
from convoq.errors import TurnCancelledError
from convoq.models import ModelRequest, ScriptedModel
from convoq.tools import ToolRegistry
from convoq.turn_state import TurnState
from tests.support.models import call_tool_then_answer

runs: list[int] = []


@tool
def count(n: int) -> int:
    runs.append(n)
    return n * 2


async def test_replaying_from_each_checkpoint_repeats_no_finished_step() -> None:
    runs.clear()
    checkpoints: list[TurnState] = []

    async def keep(state: TurnState) -> None:
        checkpoints.append(state.model_copy(deep=True))

    model = ScriptedModel(call_tool_then_answer("count", {"n": 21}))
    loop = TurnLoop(model=model, tools=ToolRegistry([count]), history=[], checkpoint=keep)
    outcome = await loop.run(TurnState.start(Message.user("go")))
    assert isinstance(outcome, Completed) and outcome.text == "tool said: 42"
    assert len(model.calls) == 2 and runs == [21] and len(checkpoints) == 3

    # After the first model reply: the tool runs, the model is asked once more.
    runs.clear()
    replay = ScriptedModel(call_tool_then_answer("count", {"n": 21}))
    loop2 = TurnLoop(model=replay, tools=ToolRegistry([count]), history=[])
    again = await loop2.run(checkpoints[0].model_copy(deep=True))
    assert isinstance(again, Completed) and runs == [21] and len(replay.calls) == 1

    # After the tool result: only the final model call happens.
    runs.clear()
    replay = ScriptedModel(call_tool_then_answer("count", {"n": 21}))
    loop3 = TurnLoop(model=replay, tools=ToolRegistry([count]), history=[])
    again = await loop3.run(checkpoints[1].model_copy(deep=True))
    assert isinstance(again, Completed) and runs == [] and len(replay.calls) == 1

    # After the final answer: nothing runs at all.
    replay = ScriptedModel(lambda r: pytest.fail("the model was called again"))
    loop4 = TurnLoop(model=replay, tools=ToolRegistry([count]), history=[])
    done = await loop4.run(checkpoints[2].model_copy(deep=True))
    assert isinstance(done, Completed) and done.messages == outcome.messages


async def test_pause_then_partial_decisions_stay_paused() -> None:
    @tool(requires_approval=True)
    def a() -> str:
        return "a ran"

    @tool(requires_approval=True)
    def b() -> str:
        return "b ran"

    def two_calls(request: ModelRequest) -> str | Message:
        if request.messages[-1].role == "user":
            return Message(role="assistant", tool_calls=[ToolCall(id="1", name="a"),
                                                         ToolCall(id="2", name="b")])  # fmt: skip
        return "done"

    loop = TurnLoop(model=ScriptedModel(two_calls), tools=ToolRegistry([a, b]), history=[])
    paused = await loop.run(TurnState.start(Message.user("x")))
    assert isinstance(paused, Paused) and [c.id for c in paused.pending] == ["1", "2"]
    state = paused.state
    state.decide("1", True)
    again = await loop.run(state)
    assert isinstance(again, Paused) and [c.id for c in again.pending] == ["2"]
    again.state.decide("2", False)
    final = await loop.run(again.state)
    assert isinstance(final, Completed)
    assert next(m.text for m in final.messages if m.role == "tool") == "a ran"
    assert "denied" in [m.text for m in final.messages if m.role == "tool"][1]


async def test_should_stop_cancels_before_the_next_step() -> None:
    async def stop() -> bool:
        return True

    loop = TurnLoop(model=ScriptedModel(lambda r: "x"), tools=ToolRegistry(), history=[],
                    should_stop=stop)  # fmt: skip
    with pytest.raises(TurnCancelledError):
        await loop.run(TurnState.start(Message.user("x")))
