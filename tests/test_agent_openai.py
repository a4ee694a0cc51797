"""The Agent over the OpenAI wire format, against a loopback server: memory, tools,
attachments and streaming end to end."""

from __future__ import annotations

import base64

from convoq import Agent, FilePart, ImagePart, Message, TextPart, tool
from convoq.memory import InMemoryConversationMemory
from convoq.models import openai
from tests.support.openai_server import OpenAIServer

PNG = b"\x89PNG\r\n\x1a\n" + b"\x01" * 64


@tool
def get_weather(city: str) -> str:
    """Weather for a city."""
    return f"{city}: sunny"


def test_agent_remembers_and_calls_tools_over_http() -> None:
    memory = InMemoryConversationMemory()
    with OpenAIServer() as server:
        model = openai("gpt-test", base_url=server.url, api_key="k")
        agent = Agent(model, instructions="Be brief.", memory=memory, conversation_id="u1",
                      tools=[get_weather])  # fmt: skip
        server.reply_text("Hello Ada.")
        agent.generate(Message(content=[TextPart(text="I am Ada, see"),
                                        ImagePart(data=PNG, mime_type="image/png"),
                                        FilePart(data=b"%PDF-1.4 x", mime_type="application/pdf",
                                                 filename="cv.pdf")]))  # fmt: skip
        server.reply_tool_call("get_weather", {"city": "Paris"})
        server.reply_text("Sunny in Paris, Ada.")
        r = agent.generate("Weather in Paris?")
        assert r.text == "Sunny in Paris, Ada."
        second = server.requests[1].json["messages"]
        assert second[0] == {"role": "system", "content": "Be brief."}
        image_url = second[1]["content"][1]["image_url"]["url"]
        assert image_url == "data:image/png;base64," + base64.b64encode(PNG).decode()
        assert second[1]["content"][2]["file"]["filename"] == "cv.pdf"
        assert second[-1] == {"role": "user", "content": "Weather in Paris?"}
        third = server.requests[2].json["messages"]
        assert third[-1]["role"] == "tool" and third[-1]["content"] == "Paris: sunny"
        assert server.requests[1].json["tools"][0]["function"]["name"] == "get_weather"
    stored = memory.load("u1")
    roles = ["user", "assistant", "user", "assistant", "tool", "assistant"]
    assert [m.role.value for m in stored] == roles


def test_agent_streams_text_deltas_over_sse() -> None:
    with OpenAIServer() as server:
        server.reply_stream(["Hel", "lo ", "there"])
        agent = Agent(openai("gpt-test", base_url=server.url, api_key="k"))
        events = list(agent.stream("hi"))
        assert server.requests[0].json["stream"] is True
    assert [e.data["text"] for e in events if e.type == "text_delta"] == ["Hel", "lo ", "there"]
    assert events[-1].type == "done" and events[-1].data["text"] == "Hello there"
