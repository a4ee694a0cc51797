"""One conversation, three model APIs: history is provider-neutral, so each turn may go to
Chat Completions, Responses or Anthropic Messages, tool calls and results included."""

from __future__ import annotations

from convoq import Agent, Message, tool
from convoq.memory import InMemoryConversationMemory
from convoq.models import anthropic, openai, responses
from tests.support import sdk_wire as w
from tests.support.openai_server import OpenAIServer


@tool
def get_weather(city: str) -> str:
    """Weather for a city."""
    return f"{city}: sunny"


def test_turns_alternate_between_model_apis_with_tool_calls_in_history() -> None:
    memory = InMemoryConversationMemory()
    with OpenAIServer() as chat_server, OpenAIServer() as resp_server, OpenAIServer() as claude:
        models = [
            openai("gpt-x", base_url=chat_server.url, api_key="k"),
            responses("gpt-x", base_url=resp_server.url, api_key="k"),
            anthropic("claude-x", base_url=claude.url.removesuffix("/v1"), api_key="k"),
        ]
        agents = [
            Agent(m, instructions="Be brief.", memory=memory, conversation_id="c",
                  tools=[get_weather])
            for m in models
        ]  # fmt: skip
        chat, resp, claude_agent = agents
        chat_server.reply_tool_call("get_weather", {"city": "Oslo"}, id="call_1")
        chat_server.reply_text("Sunny in Oslo.")
        assert chat.generate("Oslo?").text == "Sunny in Oslo."

        resp_server.reply_raw(w.response([w.call_item("call_2", "get_weather", {"city": "Rome"})])
                              .model_dump_json())  # fmt: skip
        resp_server.reply_raw(w.response([w.text_item("Sunny in Rome.")]).model_dump_json())
        assert resp.generate("Rome?").text == "Sunny in Rome."

        claude.reply_raw(w.anthropic_message(
            [w.tool_use_block("toolu_3", "get_weather", {"city": "Lima"})], stop_reason="tool_use"
        ).model_dump_json())  # fmt: skip
        claude.reply_raw(w.anthropic_message([w.text_block("Sunny in Lima.")]).model_dump_json())
        assert claude_agent.generate("Lima?").text == "Sunny in Lima."

        chat_server.reply_text("All sunny.")
        assert chat.generate("And all three?").text == "All sunny."

        for request in resp_server.requests:
            w.check_responses_body(request.json)
        for request in claude.requests:
            w.check_anthropic_body(request.json)
        # Responses saw the Chat Completions turn's call and result as its own items.
        items = resp_server.requests[0].json["input"]
        assert items[2:5] == [
            {"type": "function_call", "call_id": "call_1", "name": "get_weather",
             "arguments": '{"city": "Oslo"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "Oslo: sunny"},
            {"type": "message", "role": "assistant", "content": "Sunny in Oslo."},
        ]  # fmt: skip
        # Anthropic saw both earlier turns' calls as tool_use / tool_result blocks.
        sent = claude.requests[0].json
        assert sent["system"] == [{"type": "text", "text": "Be brief."}]
        uses = [b["id"] for m in sent["messages"] for b in m["content"] if b["type"] == "tool_use"]
        results = [b["tool_use_id"] for m in sent["messages"] for b in m["content"]
                   if b["type"] == "tool_result"]  # fmt: skip
        assert uses == results == ["call_1", "call_2"]
        # Chat Completions, last, saw the Anthropic turn's call as a tool call.
        last = chat_server.requests[-1].json["messages"]
        calls = [c["id"] for m in last for c in m.get("tool_calls") or []]
        assert calls == ["call_1", "call_2", "toolu_3"]
        assert [m["tool_call_id"] for m in last if m["role"] == "tool"] == calls
    stored = memory.load("c")
    assert [m.role.value for m in stored].count("tool") == 3
    # Each answer names the model that gave it, whichever API it came through.
    answers = [m.model for m in stored if m.role.value == "assistant"]
    assert answers == ["gpt-x"] * 4 + ["claude-x"] * 2 + ["gpt-x"]
    assert stored[-1] == Message.assistant("All sunny.", usage=stored[-1].usage,
                                           finish_reason="stop", model="gpt-x")  # fmt: skip
