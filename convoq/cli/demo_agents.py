"""Agent profiles of ``convoq demo`` (``CONVOQ_AGENTS=convoq.cli.demo_agents``).

Offline, each profile runs a small scripted model that really reads the history it is
sent (names, attachments, tool results). With ``OPENAI_API_KEY`` set, the same profiles
run on ``openai("gpt-4.1-mini")`` instead.
"""

from __future__ import annotations

import os
import re

from convoq.agent import Agent
from convoq.messages import FilePart, ImagePart, Message, MessageRole, ToolCall
from convoq.models.base import Model, ModelRequest
from convoq.models.scripted import ScriptedModel
from convoq.tools import tool

_NAME = re.compile(r"\bmy name is (\w+)", re.IGNORECASE)


def _users(request: ModelRequest) -> list[Message]:
    return [m for m in request.messages if m.role == MessageRole.USER]


def _describe(part: ImagePart | FilePart) -> str:
    if isinstance(part, FilePart):
        return f"a PDF named {part.filename or 'unnamed'} ({len(part.data)} bytes)"
    return f"a {part.mime_type.split('/')[-1].upper()} image ({len(part.data)} bytes)"


def assistant_reply(request: ModelRequest) -> str:
    """Remembers names and attachments from the history it is sent."""
    users = _users(request)
    current = users[-1]
    if current.attachments:
        return "Got it: " + " and ".join(_describe(p) for p in current.attachments) + "."
    text = current.text.lower()
    if "name" in text and "?" in text:
        names = [m.group(1) for u in users[:-1] for m in [_NAME.search(u.text)] if m]
        return f"Your name is {names[-1]}." if names else "You have not told me your name."
    if "sent" in text or "files" in text:
        earlier = [_describe(p) for u in users[:-1] for p in u.attachments]
        return "You sent me " + ", ".join(earlier) + "." if earlier else "Nothing yet."
    found = _NAME.search(current.text)
    if found:
        return f"Nice to meet you, {found.group(1)}."
    return f"You said: {current.text}"


@tool(requires_approval=True)
def transfer(amount: int, to: str) -> str:
    """Send money to someone (a human approves each transfer)."""
    return f"sent {amount} EUR to {to}"


def banker_reply(request: ModelRequest) -> str | Message:
    """Asks for one ``transfer``, then reports how it went."""
    last = request.messages[-1]
    if last.role == MessageRole.TOOL:
        return f"Done: {last.text}."
    amount = int(next(iter(re.findall(r"\d+", last.text)), "10"))
    to = (re.findall(r"to (\w+)", last.text) or ["Carol"])[-1]
    call = ToolCall(id="transfer-1", name="transfer", arguments={"amount": amount, "to": to})
    return Message(role=MessageRole.ASSISTANT, tool_calls=[call])


def _model(offline: ScriptedModel) -> Model:
    if os.environ.get("OPENAI_API_KEY"):
        from convoq.models.openai import openai  # lazy: only with a key

        return openai("gpt-4.1-mini")
    return offline


assistant = Agent(
    _model(ScriptedModel(assistant_reply, name="demo-assistant")),
    "You are a concise assistant. Remember what the user tells and sends you.",
    name="assistant",
)
banker = Agent(
    _model(ScriptedModel(banker_reply, name="demo-banker")),
    "You move money with the transfer tool when asked; then confirm in one sentence.",
    name="banker",
    tools=[transfer],
)
