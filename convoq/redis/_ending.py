"""Ending a run: the fenced writes of the turn a worker holds under its lease.

``checkpoint`` journals the turn so far; ``commit`` stores it, ``fail`` ends it storing
nothing, ``park`` keeps it waiting for approvals. Each checks the caller's fence and that
the turn is the running inbox head, inside Redis, before anything is written; commit and
fail then hand out the next turn in the same call (:mod:`convoq.redis._taking`).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, Literal, ParamSpec

from convoq.errors import InvalidMessageError, ProtocolError
from convoq.messages import Message, MessageRole
from convoq.redis._codec import (
    Encoded,
    check_turn_size,
    counters_arg,
    encode_element,
    usage_of,
)
from convoq.redis._records import Acquired, Handoff, TurnEnding
from convoq.redis._replies import EndReply, Outcome, RunningReply
from convoq.redis._taking import TakingMixin
from convoq.redis._world import park_waits, waits_described
from convoq.turn_state import TurnEvent, TurnState
from convoq.usage import children_usage, turn_usage
from convoq.waits import wait_ttl_ms

P = ParamSpec("P")
# The final status of a turn ended by these errors (any other: "failed").
_FAILED_AS = {"TurnCancelledError": "cancelled", "GuardrailTripped": "blocked"}


def next_turn_only(
    ending: Callable[P, Awaitable[Handoff]],
) -> Callable[P, Coroutine[Any, Any, Acquired | None]]:
    """``ending`` (a ``*_and_hand_off`` method) answering only the turn it hands out."""

    @functools.wraps(ending)
    async def next_turn(*args: P.args, **kwargs: P.kwargs) -> Acquired | None:
        return (await ending(*args, **kwargs)).turn

    next_turn.__doc__ = (
        f"The turn :meth:`{ending.__name__}` hands out next (None: none), for a caller that"
        " owes nothing to the turns failed on the way (they are failed all the same)."
    )
    return next_turn


class EndingMixin(TakingMixin):
    """``checkpoint``, ``commit``, ``fail`` and ``park``."""

    async def checkpoint(
        self,
        cid: str,
        turn_id: str,
        *,
        fence: int,
        state: TurnState,
        events: Sequence[TurnEvent] = (),
    ) -> bool:
        """Journal the turn so far (a rerun starts from here), after appending ``events`` to
        its stream. Fenced like commit. Returns True when a cancel was requested: the
        runner stops before its next step."""
        keys = [self.keys.inbox(cid), self.keys.lease(cid), self.keys.turn(cid, turn_id)]
        keys += [self.keys.journal(cid, turn_id), self.keys.events(cid, turn_id)]
        args = [turn_id, fence, state.model_dump_json(), self.turn_ttl_ms, self.events_maxlen]
        args += self.event_args(events)
        reply = RunningReply.parse("checkpoint", await self.scripts.run("checkpoint", keys, args))
        if reply.refusal is not None:
            raise self.refusal(reply.refusal, cid, turn_id, fence)
        return reply.cancel_requested

    def _ending_keys(self, cid: str, turn_id: str) -> list[str]:
        return [self.keys.inbox(cid), self.keys.lease(cid), *self.keys.turn_keys(cid, turn_id)]

    async def commit_and_hand_off(
        self,
        cid: str,
        turn_id: str,
        messages: list[Message],
        ending: TurnEnding,
        *,
        stop_if_cancelled: bool = False,
        output: Any = None,
        expired: bool = False,
        children: Sequence[Mapping[str, Any]] = (),
        interrupted: bool = False,
    ) -> Handoff:
        """Append the whole turn (user message first) exactly once, mark it succeeded (or,
        with ``expired``, expired: its approval ran out and its tool results say so) with
        ``result = {"text", "messages"}`` (``messages``: what the turn added after the user
        message), append ``ending.events`` and then "done" to its stream, and hand out the
        next queued turn under the same fence, or none with the lease freed. Turns failed
        on the way to the next one come back in :attr:`Handoff.failed` (as :meth:`take`).
        When ``ending.next_turn_id`` is the next turn, it comes back in this same round trip.
        ``output``: a turn with an output type, its validated answer (JSON), kept in the
        result as ``"output"``. ``children``: its sub-agent calls' child turns (``{"call_id",
        "agent", "conversation_id", "turn_id", "status", "usage"}``), kept in the result as
        ``"children"``; the result's usage adds theirs to the turn's own, the
        conversation's counters only the turn's own (each child's are on its conversation).
        ``interrupted``: a newer message stopped the turn (double texting): it is stored as
        far as it went, marked "interrupted", its text empty.

        Raises:
            StaleFenceError, NotInboxHeadError, TurnAlreadyAppliedError (a replay: nothing
            was written; treat it as success); TurnCancelledError with
            ``stop_if_cancelled`` when a cancel was requested (nothing was written: fail the
            turn as cancelled).
        """
        keys, args = self.commit_call(
            cid,
            turn_id,
            messages,
            ending,
            stop_if_cancelled=stop_if_cancelled,
            output=output,
            expired=expired,
            children=children,
            interrupted=interrupted,
        )
        reply = EndReply.parse("commit", await self.run_acked("commit", cid, keys, args))
        if reply.refusal is not None:
            raise self.refusal(reply.refusal, cid, turn_id, ending.fence)
        return await self.handed(cid, reply, ending)

    commit = next_turn_only(commit_and_hand_off)

    def commit_call(
        self,
        cid: str,
        turn_id: str,
        messages: list[Message],
        ending: TurnEnding,
        *,
        stop_if_cancelled: bool = False,
        output: Any = None,
        expired: bool = False,
        children: Sequence[Mapping[str, Any]] = (),
        interrupted: bool = False,
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of the commit script (checked and encoded, nothing sent)."""
        no_answer = expired or interrupted
        element, result, counters, encoded = self._stored_turn(
            messages, output, no_answer, children
        )
        following = self.next_turn_keys(cid, ending.expected_next)
        keys = [self.keys.meta(cid), self.keys.turns(cid), self.keys.blobs(cid)]
        keys += self._ending_keys(cid, turn_id)
        keys += [self.keys.lead(cid), *following] if following else []
        args = [turn_id, ending.fence, element, result, "1" if stop_if_cancelled else "0"]
        args += ["interrupted" if interrupted else "expired" if expired else "succeeded"]
        args += [ending.expected_next or "", *self.take_args(ending.taking())]
        args.append(counters)
        return keys, [*args, *self.event_args(ending.events), *encoded.blob_args()]

    def _stored_turn(
        self,
        messages: list[Message],
        output: Any = None,
        expired: bool = False,
        children: Sequence[Mapping[str, Any]] = (),
    ) -> tuple[bytes, str, str, Encoded]:
        """The history element of a committed turn, its result JSON, the usage counters to
        add to the conversation's and its blobs. An expired turn ends with tool results,
        not an answer: its text is empty. The result's usage adds the ``children``'s; the
        counters hold the turn's own (a child's count on its own conversation)."""
        if not messages or messages[0].role != MessageRole.USER:
            raise InvalidMessageError("a committed turn starts with its user message", rule="turn")
        encoded = Encoded()
        element = encode_element(messages, self.limits, encoded)
        check_turn_size(encoded, self.limits)
        final = messages[-1]
        usage = usage_of(messages[1:])
        result: dict[str, Any] = {
            "text": "" if expired else final.text,
            "messages": [m.model_dump(mode="json") for m in messages[1:]],
            "usage": (usage + children_usage(children)).model_dump(),
            "finish_reason": final.finish_reason,
        }
        if children:
            result["children"] = [dict(child) for child in children]
        if final.refusal is not None:
            result["refusal"] = final.refusal
        if output is not None:
            result["output"] = output
        return element, self.json_arg(result, "result"), counters_arg(usage, messages[1:]), encoded

    async def fail_and_hand_off(
        self, cid: str, turn_id: str, error: dict[str, Any], ending: TurnEnding
    ) -> Handoff:
        """End the turn as failed (``error`` = ConvoqError.to_data()), storing nothing; an
        error of type TurnCancelledError ends it as cancelled, GuardrailTripped as blocked.
        ``ending.events`` go to its stream before "done". Guards and hand-off as
        :meth:`commit_and_hand_off`."""
        status = _FAILED_AS.get(str(error.get("type")), "failed")
        following = self.next_turn_keys(cid, ending.expected_next)
        keys = self._ending_keys(cid, turn_id)
        keys += [*self.keys.history_keys(cid), *following] if following else []
        args = [turn_id, ending.fence, self.json_arg(error, "error"), status]
        args += [ending.expected_next or "", *self.take_args(ending.taking())]
        args += self.event_args(ending.events)
        reply = EndReply.parse("fail", await self.run_acked("fail", cid, keys, args))
        if reply.refusal is not None:
            raise self.refusal(reply.refusal, cid, turn_id, ending.fence)
        return await self.handed(cid, reply, ending)

    fail = next_turn_only(fail_and_hand_off)

    async def park(
        self,
        cid: str,
        turn_id: str,
        *,
        fence: int,
        state: TurnState,
        approval_ttl_ms: int,
        events: Sequence[TurnEvent] = (),
        children: Sequence[str] = (),
    ) -> Literal["parked", "resume"]:
        """Store the continuation and wait for decisions on ``state``'s undecided calls; the
        conversation stays reserved until they are decided or the wait expires (after
        ``approval_ttl_ms``, or the shortest deadline of the calls that wait for the world:
        :func:`~convoq.waits.wait_ttl_ms`). ``events`` go to its stream first. A replay for
        a turn already parked with this fence is a no-op. ``children``: the ids of the
        calls that wait for a child turn (sub-agent calls), decided by their children
        only; ``state.waits`` the calls that wait for a result or a signal. The turn is
        "waiting" when no call waits for a person, else "awaiting_approval".
        "resume": signals kept for the calls' waits decided every call; the turn is
        marked for resumption (acquire it again) instead of parked."""
        waiting = state.undecided
        if not waiting:
            raise ProtocolError("park needs a state with tool calls waiting for a decision")
        pending = self.json_arg([call.id for call in waiting], "pending")
        # The usage so far: the model calls made before the park were paid for already.
        usage = turn_usage(state.messages[1:], requests=state.steps)
        result = {
            "pending_approvals": [call.model_dump(mode="json") for call in waiting],
            "usage": usage.model_dump(),
        }
        waits, signal_keys = park_waits(self.keys, cid, state, children)
        if described := waits_described(state):
            result["waits"] = described
        ttl_ms = wait_ttl_ms(state, approval_ttl_ms)
        args = [turn_id, fence, state.model_dump_json(), pending, self.json_arg(result, "result")]
        args += [ttl_ms, self.events_maxlen, self.json_arg(waits, "waits")]
        args += self.event_args(events)
        keys = self._ending_keys(cid, turn_id) + signal_keys
        reply = Outcome.parse("park", await self.run_acked("park", cid, keys, args))
        if reply.refusal is not None:
            raise self.refusal(reply.refusal, cid, turn_id, fence)
        return "resume" if reply.status in ("RESUME", "RESUMED") else "parked"
