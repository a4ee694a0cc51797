"""A Pydantic AI profile with an approval ttl of its own, for the worker tests of profile
options (CONVOQ_AGENTS=tests.support.pai_ttl_agents): ``pai-refunds`` asks for ``refund``,
which needs approval (each run recorded under ``{prefix}:test:refunds``), and its parked
turns wait 20 s (``durable(..., approval_ttl_s=20)``)."""

from __future__ import annotations

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from convoq.integrations.pydantic_ai import durable
from tests.support.worker_agents import test_key, test_redis


def pai_refund_fn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returned = [
        p
        for m in messages[-1:]
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]
    if returned:
        return ModelResponse(parts=[TextPart(f"after tool: {returned[-1].content}")])
    return ModelResponse(parts=[ToolCallPart("refund", {"amount": 35})])


pai_refunds_agent = Agent(FunctionModel(pai_refund_fn))


@pai_refunds_agent.tool_plain(requires_approval=True, name="refund")
def pai_refund(amount: int) -> str:
    test_redis().rpush(test_key("refunds"), str(amount))
    return f"refunded {amount}"


pai_refunds = durable(pai_refunds_agent, name="pai-refunds", approval_ttl_s=20)
