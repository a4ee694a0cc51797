"""Agent profiles with guardrails, for tests on real workers
(CONVOQ_AGENTS=tests.support.guardrail_agents), on the scripted model.

``guarded``: the input guardrail ``no_secrets`` trips on "password", the output guardrail
``no_shouting`` on an answer in capitals (the model shouts when asked to "shout");
``guarded_parallel``: ``no_secrets`` beside the first model call; ``guarded_broken``: an
input guardrail that raises; ``pai_guarded``: ``guarded``'s guardrails on a Pydantic AI
profile.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from convoq import Agent, Message, RunContext
from convoq.guardrails import GuardrailResult, input_guardrail, output_guardrail
from convoq.integrations.pydantic_ai import durable
from convoq.models import ScriptedModel
from convoq.models.base import ModelRequest


def answer(request: ModelRequest) -> str:
    said = request.messages[-1].text
    return said.upper() if "shout" in said else f"ok: {said}"


@input_guardrail
def no_secrets(ctx: RunContext[Any], message: Message) -> GuardrailResult:
    if "password" in message.text:
        return GuardrailResult.trip("asks for a password", info={"turn": ctx.turn_id})
    return GuardrailResult.passed()


beside = input_guardrail(name="no_secrets", run_in_parallel=True)(no_secrets.check)


@output_guardrail
async def no_shouting(ctx: RunContext[Any], text: Any) -> GuardrailResult:
    if isinstance(text, str) and text.isupper():
        return GuardrailResult.trip("the answer shouts")
    return GuardrailResult.passed()


def broken(ctx: RunContext[Any], message: Message) -> GuardrailResult:
    raise RuntimeError("the checker is down")


guarded = Agent(ScriptedModel(answer), name="guarded", input_guardrails=[no_secrets],
                output_guardrails=[no_shouting])  # fmt: skip
guarded_parallel = Agent(ScriptedModel(answer), name="guarded_parallel",
                         input_guardrails=[beside])  # fmt: skip
guarded_broken = Agent(ScriptedModel(answer), name="guarded_broken", input_guardrails=[broken])


def _pai_answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    last = messages[-1].parts[-1]
    said = (
        last.content if isinstance(last, UserPromptPart) and isinstance(last.content, str) else ""
    )
    return ModelResponse(parts=[TextPart(said.upper() if "shout" in said else f"ok: {said}")])


pai_guarded = durable(
    PydanticAgent(FunctionModel(_pai_answer), name="pai_guarded"),
    input_guardrails=[no_secrets],
    output_guardrails=[no_shouting],
)
