"""The history an interrupted turn leaves (double texting) is one every model wire takes:
the calls it never ran answered "not run", then the next user message after the tool
results. Checked against the official SDKs' request types."""

from __future__ import annotations

from typing import Any

from openai.types.chat import completion_create_params
from pydantic import TypeAdapter

from convoq.messages import Message, ToolCall
from convoq.models import ModelRequest
from convoq.models import _anthropic_wire as anthropic_wire
from convoq.models import _openai_wire as chat_wire
from convoq.models import _responses_wire as responses_wire
from convoq.worker._interrupts import NOT_RUN, interrupted_turn
from tests.support import sdk_wire

CALLS = [
    ToolCall(id="c1", name="search", arguments={"q": "rome"}),
    ToolCall(id="c2", name="book", arguments={"q": "rome"}),
]
CHAT = {
    False: TypeAdapter(completion_create_params.CompletionCreateParamsNonStreaming),
    True: TypeAdapter(completion_create_params.CompletionCreateParamsStreaming),
}


def history() -> list[Message]:
    """An interrupted turn whose model asked for two calls, one of which ran, then the
    message that interrupted it."""
    asked = Message.assistant("looking", CALLS)
    ran = Message.tool_result(CALLS[0], "3 flights")
    stored = interrupted_turn([Message.user("Flights to Rome"), asked, ran], "t2")
    return [*stored, Message.user("Actually, Paris")]


def test_the_calls_that_did_not_run_are_answered_not_run() -> None:
    stored = history()[:-1]
    assert [m.role for m in stored] == ["user", "assistant", "tool", "tool"]
    assert (stored[3].tool_call_id, stored[3].text) == ("c2", NOT_RUN.format(by="t2"))
    # Nothing to add when every call has its result (or none was asked for).
    assert interrupted_turn(stored, "t3") == stored
    assert interrupted_turn([Message.user("hi")], "t3") == [Message.user("hi")]


def test_chat_completions_take_it() -> None:
    body: dict[str, Any] = chat_wire.build_body(
        "gpt-x", ModelRequest(messages=history()), stream=False, extra_body=None
    )
    sdk_wire._conforms(CHAT, body)
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "tool", "tool", "user"]


def test_the_responses_api_takes_it() -> None:
    body = responses_wire.build_body(
        "gpt-x", ModelRequest(messages=history()), stream=False, extra_body={},
        strict_tools=None,
    )  # fmt: skip
    sdk_wire.check_responses_body(body)
    kinds = [item.get("type", item.get("role")) for item in body["input"]]
    assert kinds[1:] == ["message", "function_call", "function_call", "function_call_output",
                         "function_call_output", "message"]  # fmt: skip


def test_the_anthropic_messages_api_takes_it() -> None:
    body = anthropic_wire.build_body(
        "claude-x", ModelRequest(messages=history()), stream=False, extra_body={},
        max_tokens=100, output_mode="tool",
    )  # fmt: skip
    sdk_wire.check_anthropic_body(body)
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["user", "assistant", "user"]  # the results and the new text: one message
    blocks = [b["type"] for b in body["messages"][2]["content"]]
    assert blocks == ["tool_result", "tool_result", "text"]
