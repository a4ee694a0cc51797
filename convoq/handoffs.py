"""Handoffs: an agent hands the conversation to another agent.

``Agent(handoffs=[...])`` takes agents (or, for workers, agent profile names); the model
sees one tool per target, ``transfer_to_<name>`` (no arguments), as in the OpenAI Agents
SDK. When the model calls one, the call gets its tool result ``{"assistant": "<name>"}``
(so the history stays valid on every model wire) and the rest of the turn runs as the
target: its instructions, tools and model, on the same turn state (the history, the
steps so far and the step limit go on). The loop learns whose turn it is from the
messages alone (:func:`current_agent`): a rerun from the step journal goes on as the
agent the turn was handed to, and never calls a model twice for one step.

Assistant messages of a turn that takes part in a handoff carry the answering agent's
name (``Message.name``). A turn may hand off at most ``CONVOQ_MAX_HANDOFFS`` times (default
5); a handoff past it is refused with a tool error the model reads, so a loop (A to B to
A...) ends. A step that calls several handoffs follows the first; the others are told so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

from convoq.errors import ConfigurationError, ConvoqError
from convoq.messages import Message, MessageRole, ToolCall
from convoq.settings import ConvoqSettings
from convoq.tools import Tool, ToolRegistry

PREFIX = "transfer_to_"
"""What every handoff tool's name starts with."""
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,52}$")


class HandoffTool(Tool):
    """A handoff offered as a tool: ``profile`` is the agent the turn goes on as (the
    worker profile of that name); ``agent`` the agent itself, when given (in process)."""

    def __init__(self, profile: str, agent: Any, *, description: str | None = None) -> None:
        async def call() -> str:  # the schema's shape; the turn loop answers the call
            raise ConvoqError("a handoff is answered by the turn loop, not as a function")

        name = PREFIX + profile
        call.__name__ = name
        said = description or f"Handoff to the {profile} agent to handle the request."
        super().__init__(call, name=name, description=said)
        self.profile = profile
        self.agent = agent


def check_name(name: Any, what: str) -> str:
    """``name`` as an agent name that may take part in handoffs: it names tools and goes
    on the wire as an assistant message's ``name`` (letters, digits, ``_`` and ``-``).

    Raises:
        ConfigurationError: naming the rule.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigurationError(
            f"{what} {name!r} cannot take part in handoffs: its name must be 1 to 52"
            " letters, digits, '_' or '-' (it names the transfer_to_ tool and the"
            " assistant messages it answers)",
            option="handoffs",
        )
    return name


def handoff_tool(value: Any, *, description: str | None = None) -> HandoffTool:
    """``value`` as a handoff tool: an agent with a name, or a profile name.

    Raises:
        ConfigurationError: an agent without a usable name, or something else.
    """
    if isinstance(value, HandoffTool):
        return value
    if isinstance(value, str):
        return HandoffTool(check_name(value, "handoff"), None, description=description)
    if callable(getattr(value, "agenerate", None)):
        name = check_name(getattr(value, "name", None), "handoff agent")
        return HandoffTool(name, value, description=description)
    raise ConfigurationError(
        f"handoffs takes agents (with names), profile names or handoff(...), not"
        f" {type(value).__name__}",
        option="handoffs",
    )


def handoff_tools(values: Iterable[Any]) -> list[HandoffTool]:
    """An agent's ``handoffs`` as tools (see :func:`handoff_tool`)."""
    if isinstance(values, str | bytes):
        raise ConfigurationError(
            "handoffs must be a list of agents or profile names", option="handoffs"
        )
    return [handoff_tool(v) for v in values]


def handoffs_of(tools: ToolRegistry | Any) -> dict[str, HandoffTool]:
    """The handoff tools of a registry, by tool name (none for anything else)."""
    if not isinstance(tools, ToolRegistry):
        return {}
    found = {spec.name: tools.get(spec.name) for spec in tools.specs()}
    return {name: tool for name, tool in found.items() if isinstance(tool, HandoffTool)}


def result_text(target: str) -> str:
    """The tool result of a handoff the turn followed."""
    return json.dumps({"assistant": target})


def target_of(result: Message) -> str | None:
    """The agent a followed handoff's tool result names, else None."""
    if result.role != MessageRole.TOOL or not (result.name or "").startswith(PREFIX):
        return None
    try:
        data = json.loads(result.text)
    except ValueError:
        return None
    target = data.get("assistant") if isinstance(data, dict) else None
    return target if isinstance(target, str) else None


def followed(messages: Iterable[Message]) -> Iterator[str]:
    """The agents a turn was handed to, in order (from its tool results)."""
    for message in messages:
        if (target := target_of(message)) is not None:
            yield target


def current_agent(messages: list[Message], started_as: str | None) -> str | None:
    """Whose turn it is: the agent the last followed handoff names, else ``started_as``."""
    targets = list(followed(messages))
    return targets[-1] if targets else started_as


def max_handoffs(given: int | None = None) -> int:
    """Handoffs one turn may make: ``given``, else ``CONVOQ_MAX_HANDOFFS``, else 5
    (:data:`convoq.defaults.MAX_HANDOFFS`)."""
    return given if given is not None else ConvoqSettings().max_handoffs


def answers(
    calls: list[ToolCall], tools: dict[str, HandoffTool], made: int, limit: int
) -> dict[str, str]:
    """The tool results of one step's handoff calls, by call id: the first one is followed
    (``{"assistant": name}``) unless the turn made ``limit`` handoffs already; the others
    are told why not."""
    out: dict[str, str] = {}
    for call in calls:
        tool = tools.get(call.name)
        if tool is None:
            continue
        if out:
            out[call.id] = "Error: only the first handoff of a step is followed; not this one"
        elif made >= limit:
            out[call.id] = (
                f"Error: this turn handed off {made} times, the most allowed"
                " (CONVOQ_MAX_HANDOFFS): answer without another handoff"
            )
        else:
            out[call.id] = result_text(tool.profile)
    return out


def check_inline(tools: ToolRegistry) -> None:
    """Refuse an in-process turn of an agent whose handoff targets are only names.

    Raises:
        ConfigurationError: naming the option and the target's profile.
    """
    for tool in handoffs_of(tools).values():
        if tool.agent is None:
            raise ConfigurationError(
                f"handoff {tool.profile!r} is a worker profile name (handoffs): only"
                " workers can run it; in process give the Agent itself",
                option="handoffs",
                profile=tool.profile,
            )


def find(start: Any, name: str) -> Any:
    """The agent called ``name`` among ``start`` and those it hands off to (transitively),
    or None."""
    seen: set[int] = set()
    todo = [start]
    while todo:
        agent = todo.pop()
        if id(agent) in seen:
            continue
        seen.add(id(agent))
        if getattr(agent, "name", None) == name:
            return agent
        todo.extend(t.agent for t in handoffs_of(getattr(agent, "tools", None)).values() if t.agent)
    return None


def last_speaker(history: list[Message]) -> str | None:
    """The name of the agent that answered the history's last turn (its last assistant
    message's ``name``: set in turns that took part in a handoff), else None."""
    for message in reversed(history):
        if message.role == MessageRole.ASSISTANT:
            return message.name
        if message.role == MessageRole.USER:
            return None
    return None


def reachable(start: Any, lookup: Any) -> set[str]:
    """The names of the agents ``start`` hands off to, directly or through others
    (``lookup(name)``: the agent of that name when known, else None: a leaf)."""
    found: set[str] = set()
    todo = [start]
    while todo:
        for tool in handoffs_of(getattr(todo.pop(), "tools", None)).values():
            if tool.profile not in found:
                found.add(tool.profile)
                nxt = tool.agent if tool.agent is not None else lookup(tool.profile)
                if nxt is not None:
                    todo.append(nxt)
    return found


def continues_as(start: Any, history: list[Message], lookup: Any) -> str | None:
    """The agent a new turn of ``start`` runs as, when not ``start``: the one that answered
    the conversation's last turn, when ``start`` hands off to it (directly or through
    others). None: ``start`` runs the turn."""
    speaker = last_speaker(history)
    name = getattr(start, "name", None)
    if speaker is None or speaker == name or not handoffs_of(getattr(start, "tools", None)):
        return None
    return speaker if speaker in reachable(start, lookup) else None
