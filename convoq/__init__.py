"""convoq: AI-agent conversations as distributed, durable work.

In process::

    agent = Agent(model=openai("gpt-4.1-mini"), memory=FileConversationMemory("convos"))
    agent.generate("My name is Ada.", conversation_id="user-42")

Queued on Celery workers, history in Redis::

    handle = Client().submit("user-42", "What is my name?", agent="assistant")
    handle.wait(timeout=30).text

Layers: a module imports only from layers below its own. The one map is the
``[tool.importlinter]`` "convoq layers" contract in ``pyproject.toml`` (checked by
``make lint``, shown as it is on the docs' Architecture page).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from convoq._sync import set_blocking_threads
from convoq.agent import Agent
from convoq.agent_response import Continuation, Response
from convoq.context import RunContext
from convoq.errors import ConvoqError, GuardrailTripped, ToolFailure
from convoq.guardrails import GuardrailResult, input_guardrail, output_guardrail
from convoq.loaders import load_image, load_pdf
from convoq.messages import (
    FilePart,
    GenerationRequest,
    ImagePart,
    Message,
    MessageRole,
    TextPart,
    ToolCall,
)
from convoq.tokens import RecordedTokenCounter, TokenCounter, TokenizerCounter
from convoq.tools import Tool, tool
from convoq.turn_state import Decision, TurnEvent
from convoq.usage import Usage
from convoq.waits import CallDeferred, WaitForSignal

if TYPE_CHECKING:
    from convoq.client import AsyncClient, AsyncTurnHandle, Client, TurnHandle, TurnResult

__version__ = "0.1.0"

# The client pulls in Celery; import it only when asked for.
_LAZY = {
    "AsyncClient": "convoq.client",
    "AsyncTurnHandle": "convoq.client",
    "Client": "convoq.client",
    "TurnHandle": "convoq.client",
    "TurnResult": "convoq.client",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'convoq' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "Agent",
    "AsyncClient",
    "AsyncTurnHandle",
    "CallDeferred",
    "Client",
    "Continuation",
    "ConvoqError",
    "Decision",
    "FilePart",
    "GenerationRequest",
    "GuardrailResult",
    "GuardrailTripped",
    "ImagePart",
    "Message",
    "MessageRole",
    "RecordedTokenCounter",
    "Response",
    "RunContext",
    "TextPart",
    "TokenCounter",
    "TokenizerCounter",
    "Tool",
    "ToolCall",
    "ToolFailure",
    "TurnEvent",
    "TurnHandle",
    "TurnResult",
    "Usage",
    "WaitForSignal",
    "input_guardrail",
    "load_image",
    "load_pdf",
    "output_guardrail",
    "set_blocking_threads",
    "tool",
]
