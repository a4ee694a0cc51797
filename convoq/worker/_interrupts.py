"""What an interrupted turn stores (double texting, ``if_busy="interrupt"``).

A turn a newer message interrupts stops at a step boundary and is stored as far as it
went: its user message and the messages of its finished steps. A tool call the model
asked for that did not run (the turn stopped right after the model call, or it was parked
waiting for an approval) gets a tool result saying so, so no call is left unanswered: every
model wire takes the history that follows (tool results, then the next user message).
"""

from __future__ import annotations

from convoq.errors import TurnCancelledError
from convoq.messages import Message, MessageRole
from convoq.redis.protocol import Acquired
from convoq.redis.roles import RunnerStore

NOT_RUN = (
    "Not run: the user sent a new message (turn {by}) before this call ran, and the turn"
    " was interrupted."
)


def interrupted_turn(messages: list[Message], by: str | None) -> list[Message]:
    """``messages`` (user message first) with a "not run" tool result for every call of
    the last assistant message that has none."""
    kept = list(messages)
    for index in range(len(kept) - 1, -1, -1):
        message = kept[index]
        if message.role == MessageRole.ASSISTANT:
            answered = {m.tool_call_id for m in kept[index + 1 :]}
            for call in message.tool_calls:
                if call.id not in answered:
                    kept.append(Message.tool_result(call, NOT_RUN.format(by=by or "?")))
            break
    return kept


def stored_so_far(journaled: list[Message] | None, acq: Acquired) -> list[Message]:
    """The turn as far as it went: as last journaled by this run, else as it was handed
    out (a journal of an earlier run, a continuation), else its user message alone."""
    if journaled is not None:
        return journaled
    if acq.state is not None:
        return list(acq.state.messages)
    return [acq.turn.input]


async def why_stopped(protocol: RunnerStore, acq: Acquired) -> tuple[str | None, str | None]:
    """``(mode, by)`` when a newer message's submit stopped the turn (``"interrupt"`` or
    ``"rollback"``, and that turn's id), else ``(None, None)``. A cancel requested as well
    wins over an interrupt: the mode is then None."""
    turn = acq.turn
    if turn.stop == "interrupt":  # flagged before this run took it
        return turn.stop, turn.stopped_by
    flags = await protocol.stop_flags(turn.conversation_id, turn.turn_id)
    if flags.mode == "interrupt" and flags.cancel:
        return None, None
    return flags.mode, flags.by


def rolled_back(by: str | None) -> TurnCancelledError:
    """The error a running turn that a ``rollback`` stopped ends with."""
    return TurnCancelledError(
        f"the turn was rolled back: turn {by} was submitted with if_busy='rollback'",
        reason="rolled_back",
        by=by,
    )


async def discard_if_stopped(protocol: RunnerStore, acq: Acquired) -> bool:
    """A turn that parked although a newer message's submit had asked it to stop (the
    flag came between its last journal write and its park) is discarded now, as that
    submit would have done had it found it parked. True when it was."""
    mode, by = await why_stopped(protocol, acq)
    if mode is None:
        return False
    turn = acq.turn
    reason = "rolled back" if mode == "rollback" else "interrupted"
    await protocol.discard(turn.conversation_id, turn.turn_id, reason=f"{reason} by turn {by}")
    return True
