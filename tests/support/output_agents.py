"""Agent profiles for typed-output and model-settings worker tests
(CONVOQ_AGENTS=tests.support.output_agents): Chat Completions models at ``OPENAI_BASE_URL``
(the test's loopback server, which records every request body) and scripted ones."""

from __future__ import annotations

from pydantic import BaseModel

from convoq import Agent, Message, ToolCall, tool
from convoq.messages import MessageRole
from convoq.models import ModelRequest, ScriptedModel, openai


class City(BaseModel):
    name: str
    population: int


@tool
def lookup(topic: str) -> str:
    """Look a topic up."""
    return f"notes on {topic}"


@tool(requires_approval=True)
def publish(city: str) -> str:
    """Publish a city (needs a human's approval)."""
    return f"published {city}"


# The model reads OPENAI_BASE_URL and OPENAI_API_KEY from the worker's environment.
typed_city = Agent(
    openai("gpt-test"),
    name="typed_city",
    output_type=City,
    model_settings={"temperature": 0.1, "max_tokens": 50, "extra_body": {"user": "profile"}},
)
chat = Agent(openai("gpt-test"), name="chat", tools=[lookup])


def stubborn_fn(request: ModelRequest) -> str:
    """Never fits City."""
    return '{"name": 3}'


stubborn = Agent(ScriptedModel(stubborn_fn), name="stubborn", output_type=City, output_retries=2)


def publisher_fn(request: ModelRequest) -> Message | dict[str, object]:
    """Asks for ``publish`` once, then answers with a City."""
    if request.messages[-1].role == MessageRole.TOOL:
        return {"name": "Oslo", "population": 1}
    call = ToolCall(id="call-publish", name="publish", arguments={"city": "Oslo"})
    return Message.assistant("", [call])


publisher = Agent(ScriptedModel(publisher_fn), name="publisher", tools=[publish], output_type=City)
