"""Compaction: when the unsummarised part of a conversation passes a threshold, its
oldest turns are summarised by a model and the summary is stored with its watermark.

A :class:`CompactionPolicy` on an Agent (``Agent(..., compaction=policy)``) compacts in
process right after a turn is stored; a worker running that profile sends the
conversation a ``convoq.compact`` task instead. Either way :func:`compact_idle` first
reserves the conversation like a turn (so it never runs beside one of its turns; a busy
conversation is left for the next time), and the summary is committed in one fenced write
that is refused if the history or the previous summary changed meanwhile.

The summariser sees the previous summary and a plain-text transcript of the turns it
folds in; attachments appear as ``[image/png attachment]`` placeholders, and once
summarised a turn (its attachments with it) is no longer sent.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass

from convoq.errors import ConfigurationError, ConversationBusyError, SummaryConflictError
from convoq.memory.base import ConversationMemory, StoredConversationMemory
from convoq.messages import Message, MessageRole, TextPart
from convoq.models.base import Model, ModelRequest
from convoq.summary import SUMMARY_PREFIX, Summary
from convoq.tokens import DEFAULT_COUNTER, TokenCounter
from convoq.window import split_turns

log = logging.getLogger("convoq.compaction")

DEFAULT_INSTRUCTIONS = (
    "You keep the running summary of a conversation between a user and an assistant."
    " Merge the previous summary (if any) with the new turns into one concise summary:"
    " facts, names, decisions, open questions and the user's preferences. Answer with the"
    " summary only."
)


@dataclass(frozen=True)
class CompactionPolicy:
    """When and how a conversation is summarised.

    Args:
        summariser: the model that writes summaries (``ScriptedModel`` in tests).
        max_turns: compact once more than this many turns are unsummarised.
        max_tokens: compact once the unsummarised turns take more tokens than this.
        keep_last_turns: the newest turns always left unsummarised (sent as they are).
        instructions: the summariser's system message.
        counter: counts tokens for ``max_tokens`` (None: the default counter).
    """

    summariser: Model
    max_turns: int | None = None
    max_tokens: int | None = None
    keep_last_turns: int = 2
    instructions: str = DEFAULT_INSTRUCTIONS
    counter: TokenCounter | None = None

    def __post_init__(self) -> None:
        if self.max_turns is None and self.max_tokens is None:
            raise ConfigurationError("a CompactionPolicy needs max_turns or max_tokens")
        for name in ("max_turns", "max_tokens", "keep_last_turns"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < 0):
                raise ConfigurationError(f"{name} must be an int >= 0")

    def due(self, unsummarised: list[list[Message]]) -> bool:
        """Whether these unsummarised turns pass a threshold."""
        if self.max_turns is not None and len(unsummarised) > self.max_turns:
            return True
        if self.max_tokens is None:
            return False
        counter = self.counter or DEFAULT_COUNTER
        return sum(counter.count(turn) for turn in unsummarised) > self.max_tokens


async def compact(
    memory: StoredConversationMemory, conversation_id: str, policy: CompactionPolicy
) -> Summary | None:
    """Summarise the oldest unsummarised turns if the policy says so; the new summary, or
    None when none was due. The caller keeps turns of the conversation out meanwhile.

    Raises:
        SummaryConflictError: the history or summary changed underneath (nothing stored).
    """
    # Counters first (cheap on Redis): no history is read while nothing can be due. A
    # token threshold still reads the history once more turns than are kept wait.
    pending = await memory.aunsummarised_turns(conversation_id)
    floor = policy.keep_last_turns
    if policy.max_tokens is None and policy.max_turns is not None:
        floor = max(policy.max_turns, floor)
    if pending <= floor:
        return None
    messages, previous, basis = await memory.asummary_state(conversation_id)
    turns = split_turns(messages)[1]
    watermark = previous.watermark if previous else 0
    unsummarised = turns[watermark:]
    fold = len(unsummarised) - policy.keep_last_turns
    if fold <= 0 or not policy.due(unsummarised):
        return None
    request = ModelRequest(
        messages=[
            Message.system(policy.instructions),
            Message.user(_prompt(previous, unsummarised[:fold])),
        ]
    )
    answer = await policy.summariser.request(request)
    summary = Summary.of(
        answer.text, watermark=watermark + fold, version=(previous.version if previous else 0) + 1
    )
    await memory.acommit_summary(conversation_id, summary, basis)
    return summary


async def compact_idle(
    memory: ConversationMemory, conversation_id: str, policy: CompactionPolicy
) -> Summary | None:
    """:func:`compact` while holding the conversation like a turn; None (nothing done)
    when a turn holds it, the memory keeps no summaries, or the history changed."""
    if not isinstance(memory, StoredConversationMemory):
        return None
    token = f"compact-{secrets.token_hex(8)}"
    try:
        await memory.areserve(conversation_id, token)
    except ConversationBusyError:
        return None  # a turn runs: compaction comes again after a later turn
    try:
        return await compact(memory, conversation_id, policy)
    except SummaryConflictError as exc:
        log.info("compaction of %s skipped: %s", conversation_id, exc.message)
        return None
    finally:
        await memory.arelease(conversation_id, token)


def _prompt(previous: Summary | None, turns: list[list[Message]]) -> str:
    lines = []
    if previous is not None:
        lines += ["Previous summary:", previous.text.removeprefix(SUMMARY_PREFIX), ""]
    lines.append("New turns:")
    for turn in turns:
        lines += [_line(message) for message in turn]
    return "\n".join(lines)


def _line(message: Message) -> str:
    parts = []
    for part in message.content:
        if isinstance(part, TextPart):
            parts.append(part.text)
        else:
            parts.append(f"[{part.mime_type} attachment]")
    for call in message.tool_calls:
        parts.append(f"[calls {call.name} with {call.arguments}]")
    role = "tool result" if message.role == MessageRole.TOOL else message.role.value
    return f"{role}: {' '.join(parts)}"
