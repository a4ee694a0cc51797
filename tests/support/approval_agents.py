"""Profiles for the approval tests on workers (CONVOQ_AGENTS=tests.support.approval_agents).

``refunder``'s tool ``refund(amount: int, order: str)`` needs approval and records each
run in the test Redis under ``{CONVOQ_PREFIX}:test:refunds``. Its model reads the user's
text: a JSON object is the arguments of a ``refund`` call (whatever they are: a test
sends some that do not fit), anything else is answered at once (``noted: ...``). Both
model calls report usage, as a server would.
"""

from __future__ import annotations

import json

from convoq import Agent, Message, ToolCall, tool
from convoq.messages import MessageRole
from convoq.models import ModelRequest, ScriptedModel
from convoq.usage import Usage
from tests.support.worker_agents import test_key, test_redis

CALL_USAGE = Usage(requests=1, prompt_tokens=40, completion_tokens=7, total_tokens=47)
ANSWER_USAGE = Usage(requests=1, prompt_tokens=60, completion_tokens=9, total_tokens=69)


@tool(requires_approval=True)
def refund(amount: int, order: str) -> str:
    """Refund an order (needs a human's approval)."""
    test_redis().rpush(test_key("refunds"), f"{amount} {order}")
    return f"refunded {amount} on {order}"


def refunder_fn(request: ModelRequest) -> Message:
    last = request.messages[-1]
    if last.role == MessageRole.TOOL:
        return Message.assistant(f"refund: {last.text}", usage=ANSWER_USAGE)
    text = last.text
    if not text.startswith("{"):
        return Message.assistant(f"noted: {text}", usage=ANSWER_USAGE)
    call = ToolCall(id=f"refund-{len(request.messages)}", name="refund", arguments=json.loads(text))
    return Message.assistant("", [call], usage=CALL_USAGE)


refunder = Agent(ScriptedModel(refunder_fn), name="refunder", tools=[refund])
