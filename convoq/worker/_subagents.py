"""Sub-agent calls on workers: child turns, and the parent that waits for them parked.

A turn whose model step calls sub-agents parks like a turn waiting for approvals (its
pending calls are the sub-agent calls; it holds no worker slot). Then, for each call:
its child turn is queued on the child conversation (:func:`~convoq.subagents.child_ids`,
with an idempotency key of the child's turn id: queuing it again finds it), and once the
child is final the call is decided (the ``decide`` script, ``by`` naming the child); the
decision of the last call marks the parent for resumption and it is kicked. On resume,
each call's tool result is read from its child's record (:class:`StoredChildren`).

Who does this (:meth:`SubAgents.settle`, idempotent): the worker that parked the parent,
at once; the worker that ended a child, for its parent; and, every sweep period, the
sweeping worker for every parked parent (a worker killed between two of these steps leaves
nothing lost: the next pass queues what is missing and decides what is final). The same
pass cancels the children of a parent that is final (cancelled, failed, expired) while
they still run: cancelling a parent cancels its children within a sweep period.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from convoq.context import RunContext
from convoq.errors import ConfigurationError, UnknownTurnError
from convoq.messages import Message, ToolCall
from convoq.profile import AgentProfile
from convoq.redis._records import FINAL_STATUSES, TurnRecord
from convoq.redis.roles import TurnControl, TurnReader
from convoq.subagents import (
    CHILD_MARK,
    OPTION,
    SubAgentTool,
    child_ids,
    child_input,
    result_of,
)
from convoq.tools import ToolOutput, ToolRegistry
from convoq.usage import Usage

log = logging.getLogger("convoq.worker")

Kick = Callable[[str], Awaitable[None]]
PARKED = ("waiting", "awaiting_approval")
"""The statuses of a parked turn: waiting for child turns only, or for a person too."""


class ChildStore(TurnControl, Protocol):
    """What the sub-agent calls need of the store (the worker's turn protocol): queue a
    child turn, decide its parent's call when it ends, cancel it with its parent."""


def subagent_tools_of(profile: AgentProfile | None) -> dict[str, SubAgentTool]:
    """A profile's sub-agent tools by tool name (none for a profile without tools)."""
    tools = getattr(profile, "tools", None)
    if not isinstance(tools, ToolRegistry):
        return {}
    found = {spec.name: tools.get(spec.name) for spec in tools.specs()}
    return {name: tool for name, tool in found.items() if isinstance(tool, SubAgentTool)}


def check_subagents(profiles: Mapping[str, AgentProfile]) -> list[AgentProfile]:
    """The sub-agents the profiles name that are agents but no profile of their own yet
    (served too, so their child turns run). Raises ConfigurationError for a sub-agent
    named by profile name that no profile has."""
    added: dict[str, AgentProfile] = {}
    for name, profile in profiles.items():
        for tool in subagent_tools_of(profile).values():
            if tool.profile in profiles or tool.profile in added:
                continue
            if isinstance(tool.agent, AgentProfile):
                added[tool.profile] = tool.agent
                continue
            raise ConfigurationError(
                f"agent profile {name!r} has the sub-agent {tool.profile!r} (subagents),"
                " which no profile of the workers is: add that agent to the agents module",
                profile=name,
                option="subagents",
            )
    return list(added.values())


@dataclass(frozen=True)
class StoredChildren:
    """The :class:`~convoq.subagents.Children` of one turn on a worker: sub-agent calls
    park as child turns; a decided call's result is its child's answer or error."""

    store: ChildStore
    depth: int
    max_depth: int
    max_fanout: int
    parks: bool = True

    async def run(self, tool: SubAgentTool, call: ToolCall, ctx: RunContext[Any]) -> ToolOutput:
        child = child_ids(ctx.conversation_id or "", ctx.turn_id, call.id)
        try:
            record = await self.store.get_turn(child.conversation_id, child.turn_id)
        except UnknownTurnError:
            return result_of(tool.profile, "lost", None, {"message": "its record is gone"})
        if record.status not in FINAL_STATUSES:
            return result_of(tool.profile, record.status, None, {"message": "not finished"})
        return result_of(tool.profile, record.status, record.result, record.error)


async def children_of(
    store: TurnReader, profile: AgentProfile | None, cid: str, tid: str, messages: list[Message]
) -> list[dict[str, Any]]:
    """The child turns of a finished turn's sub-agent calls, in call order: each one's
    call id, agent, ids, status and usage (its result's, which holds its own children's).
    A call refused past a limit made no child and is left out; a turn that made no
    sub-agent call costs no read."""
    tools = subagent_tools_of(profile)
    calls = [c for m in messages for c in m.tool_calls or () if c.name in tools]
    found: list[dict[str, Any]] = []
    for call in calls:
        child = child_ids(cid, tid, call.id)
        try:
            record = await store.get_turn(child.conversation_id, child.turn_id)
        except UnknownTurnError:
            continue
        usage = (record.result or {}).get("usage") or Usage().model_dump()
        found.append({
            "call_id": call.id, "agent": tools[call.name].profile,
            "conversation_id": child.conversation_id, "turn_id": child.turn_id,
            "status": record.status, "usage": usage,
        })  # fmt: skip
    return found


def depth_of(options: Mapping[str, Any]) -> int:
    """How deep a turn is (0: nobody called it), from its options."""
    called = options.get(OPTION)
    depth = called.get("depth") if isinstance(called, dict) else 0
    return depth if isinstance(depth, int) and depth >= 0 else 0


class SubAgents:
    """A worker's side of sub-agent calls (see the module)."""

    def __init__(
        self,
        store: ChildStore,
        profiles: Mapping[str, AgentProfile],
        kick: Kick,
        *,
        max_depth: int,
        max_fanout: int,
    ) -> None:
        self._store = store
        self._profiles = profiles
        self._kick = kick
        self._limits = (max_depth, max_fanout)

    def children_for(self, options: Mapping[str, Any]) -> StoredChildren:
        """The children of a turn with ``options`` (its depth in them)."""
        return StoredChildren(self._store, depth_of(options), *self._limits)

    async def parked(self, cid: str, tid: str) -> None:
        """A turn parked: queue its children now (the sweep would, a period later)."""
        await self._quietly(self.settle(cid, tid), cid, tid)

    async def finished(self, cid: str, tid: str, options: Mapping[str, Any]) -> None:
        """A turn ended: if it is a child, its parent's call may be decided now."""
        parent = options.get(OPTION)
        if isinstance(parent, dict):
            pcid, ptid = parent.get("conversation_id"), parent.get("turn_id")
            if isinstance(pcid, str) and isinstance(ptid, str):
                await self._quietly(self.settle(pcid, ptid), cid, tid)

    async def sweep(self) -> None:
        """One pass over the conversations' inbox heads: every parked parent settled; the
        children of final parents cancelled."""
        store = self._store
        async for key in store.redis.scan_iter(match=store.keys.inbox_pattern(), count=1000):
            cid = store.keys.conversation_of_inbox(key)
            if cid is None or not await self._may_concern(cid):
                continue
            head = await store.redis.lindex(store.keys.inbox(cid), 0)
            if head is not None:
                tid = head.decode() if isinstance(head, bytes) else str(head)
                await self._quietly(self._sweep_head(cid, tid), cid, tid)

    async def _may_concern(self, cid: str) -> bool:
        """A child conversation, or one whose head is parked: the others cost one read."""
        if CHILD_MARK in cid:
            return True
        state = await self._store.redis.hget(self._store.keys.lease(cid), "state")
        return state in (b"parked", "parked")

    async def _sweep_head(self, cid: str, tid: str) -> None:
        record = await self._store.get_turn(cid, tid)
        if record.status in PARKED and self._waiting_calls(record):
            await self.settle(cid, tid)
        if isinstance(record.options.get(OPTION), dict) and record.status not in FINAL_STATUSES:
            await self._cancel_if_orphan(record)

    async def settle(self, cid: str, tid: str) -> None:
        """Queue the children of the parked turn ``tid`` that are missing, decide the calls
        whose child is final, and kick the parent once all are decided."""
        record = await self._store.get_turn(cid, tid)
        if record.status not in PARKED:
            return
        resume = False
        for call, tool in self._waiting_calls(record):
            child = child_ids(cid, tid, call.id)
            await self._queue(child.conversation_id, child.turn_id, tool, call, record)
            status = (await self._store.get_turn(child.conversation_id, child.turn_id)).status
            if status in FINAL_STATUSES:
                by = f"subagent {child.conversation_id} {child.turn_id}"
                decided = await self._store.record_decision(
                    cid, tid, call_id=call.id, approved=True, by=by, kind="child"
                )
                resume = resume or decided.outcome == "resume"
        if resume:
            await self._kick(cid)

    def _waiting_calls(self, record: TurnRecord) -> list[tuple[ToolCall, SubAgentTool]]:
        """The parked turn's pending calls that are sub-agent calls, with their tools."""
        tools = subagent_tools_of(self._profiles.get(record.agent))
        pending = (record.result or {}).get("pending_approvals") or []
        calls = [ToolCall.model_validate(raw) for raw in pending]
        return [(call, tools[call.name]) for call in calls if call.name in tools]

    async def _queue(
        self, cid: str, tid: str, tool: SubAgentTool, call: ToolCall, parent: TurnRecord
    ) -> None:
        """Queue a child turn (a repeat finds it: same idempotency key) and kick it."""
        called = {"conversation_id": parent.conversation_id, "turn_id": parent.turn_id,
                  "call_id": call.id, "depth": depth_of(parent.options) + 1}  # fmt: skip
        options: dict[str, Any] = {OPTION: called}
        if parent.metadata:
            options["metadata"] = parent.metadata
        submitted = await self._store.submit(
            cid, tid, agent=tool.profile, message=Message.user(child_input(call)),
            options=options, idempotency_key=tid,
        )  # fmt: skip
        if submitted.position == 0 and not submitted.kicked:
            await self._kick(cid)

    async def _cancel_if_orphan(self, child: TurnRecord) -> None:
        """Cancel a child turn whose parent is final or gone."""
        called = child.options[OPTION]
        try:
            parent = await self._store.get_turn(called["conversation_id"], called["turn_id"])
            ended = parent.status in FINAL_STATUSES
        except UnknownTurnError:
            ended = True
        if ended:
            cid, tid = child.conversation_id, child.turn_id
            outcome = await self._store.cancel(cid, tid)
            log.info("child turn %s/%s of an ended parent: %s", cid, tid, outcome)

    @staticmethod
    async def _quietly(work: Awaitable[None], cid: str, tid: str) -> None:
        """Run ``work``; a failure is logged: the next sweep tries again."""
        try:
            await work
        except Exception as exc:  # a sweep duty: whatever failed, the next pass retries
            log.warning("sub-agent calls of %s/%s: %r (the next sweep tries again)", cid, tid, exc)
