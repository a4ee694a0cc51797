"""What is *sent* of a stored history (never what is stored): split it into turns, keep
the last N of them and the newest whole turns that fit a token budget; and whose N and
budget those are, a turn's or its agent's (:class:`WindowRule`, the one place that says).

A turn is never split, so tool calls always travel with their results; the leading
system/developer messages (and a stored summary among them) are always sent.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from convoq.errors import ConvoqError
from convoq.messages import Message, MessageRole
from convoq.tokens import DEFAULT_COUNTER, TokenCounter

_LEADING_ROLES = (MessageRole.SYSTEM, MessageRole.DEVELOPER)


def split_turns(messages: list[Message]) -> tuple[list[Message], list[list[Message]]]:
    """Return (leading system/developer messages, turns).

    A turn starts at a user message and runs to the next one. Messages before the first
    user message that are not system/developer open a turn of their own, so nothing is lost.
    """
    lead: list[Message] = []
    turns: list[list[Message]] = []
    index = 0
    while index < len(messages) and messages[index].role in _LEADING_ROLES:
        lead.append(messages[index])
        index += 1
    for message in messages[index:]:
        if message.role == MessageRole.USER or not turns:
            turns.append([message])
        else:
            turns[-1].append(message)
    return lead, turns


def last_turns(messages: list[Message], keep: int | None) -> list[Message]:
    """Leading system/developer messages plus the last ``keep`` whole turns.

    ``keep`` of ``None`` or ``0`` keeps everything.
    """
    if not keep:
        return list(messages)
    if keep < 0:
        raise ConvoqError("keep_last_turns must be >= 0 (0 keeps every turn)")
    # split_turns' cut, found from the end without building the turns: the keep-th user
    # message from the end starts the window (fewer than keep turns: everything is kept).
    lead_end = 0
    while lead_end < len(messages) and messages[lead_end].role in _LEADING_ROLES:
        lead_end += 1
    starts = 0
    for index in range(len(messages) - 1, lead_end - 1, -1):
        if messages[index].role == MessageRole.USER:
            starts += 1
            if starts == keep:
                return messages[:lead_end] + messages[index:]
    return list(messages)


def newest_fitting(turn_costs: list[int], budget: int) -> int:
    """How many of the newest turns fit ``budget`` (costs oldest first): a contiguous run
    from the newest back, stopping at the first turn that does not fit."""
    used, kept = 0, 0
    for cost in reversed(turn_costs):
        if used + cost > budget:
            break
        used += cost
        kept += 1
    return kept


def check_budget(max_tokens: int | None, name: str = "max_history_tokens") -> int | None:
    """``max_tokens`` if it is None or an int >= 0, else ConvoqError (before any I/O)."""
    if max_tokens is None:
        return None
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise ConvoqError(f"{name} must be an int >= 0 or None (None: no budget)")
    return max_tokens


@dataclass(frozen=True)
class Window:
    """The part of a history sent to the model.

    Attributes:
        keep_last_turns: at most this many of the newest turns (None or 0: no limit).
        max_tokens: the newest whole turns whose tokens, with the leading messages', fit
            this budget (None: no budget). Leading messages are sent even when they alone
            exceed it; a newest turn that does not fit leaves no earlier turn sent.
        counter: counts tokens (None: :class:`convoq.tokens.RecordedTokenCounter`).
        with_summary: what a turn sends: a stored summary (:mod:`convoq.summary`) replaces
            the turns it covers, as a system message after the leading ones.
    """

    keep_last_turns: int | None = None
    max_tokens: int | None = None
    counter: TokenCounter | None = None
    with_summary: bool = False

    def __post_init__(self) -> None:
        if self.keep_last_turns is not None and self.keep_last_turns < 0:
            raise ConvoqError("keep_last_turns must be >= 0 (0 keeps every turn)")
        check_budget(self.max_tokens)

    @property
    def everything(self) -> bool:
        """Whether the window keeps the whole history."""
        return not self.keep_last_turns and self.max_tokens is None

    @property
    def token_counter(self) -> TokenCounter:
        return self.counter if self.counter is not None else DEFAULT_COUNTER

    @property
    def default_counter(self) -> bool:
        """Whether tokens are counted by the default counter (stored counts can be used)."""
        return self.counter is None or self.counter is DEFAULT_COUNTER

    def apply(self, messages: list[Message]) -> list[Message]:
        """The messages of ``messages`` this window sends (applying it twice is harmless)."""
        if self.everything:
            return list(messages)
        if self.max_tokens is None:
            return last_turns(messages, self.keep_last_turns)
        lead, turns = split_turns(messages)
        if self.keep_last_turns:
            turns = turns[-self.keep_last_turns :]
        if self.max_tokens is not None:
            counter = self.token_counter
            budget = self.max_tokens - counter.count(lead) if lead else self.max_tokens
            kept = newest_fitting([counter.count(turn) for turn in turns], max(budget, 0))
            turns = turns[len(turns) - kept :]
        return lead + [m for turn in turns for m in turn]


STORE_CHOOSES = -1
"""An agent's window that the store chooses with a read of its own (a token budget or a
summary): its turns are handed out with one turn of history only."""


@dataclass(frozen=True)
class AgentWindows:
    """The history window (turns, 0 = all) each agent's turns are handed out with, decided
    once per agent profile when a worker starts. The scripts that hand out a turn (acquire,
    commit and fail) pick the head turn's entry, or the turn's own ``keep_last_turns``
    option: a worker that runs a whole-history profile beside a last-10 one still reads
    only 10 turns for the latter.

    Attributes:
        by_agent: turns by agent name (:data:`STORE_CHOOSES`: chosen by the store).
        default: the window of an agent not listed.
    """

    by_agent: Mapping[str, int] = field(default_factory=dict)
    default: int = 0

    @classmethod
    def of(cls, window: int | AgentWindows) -> AgentWindows:
        """``window`` by agent: a number of turns is the window of every agent."""
        return window if isinstance(window, AgentWindows) else cls(default=window)

    @functools.cached_property
    def encoded(self) -> str:
        """The scripts' form: JSON ``[default, {agent: turns}]`` (built once: a worker
        sends the same windows with every turn it takes)."""
        return json.dumps([self.default, dict(self.by_agent)], separators=(",", ":"))


class WindowSettings(Protocol):
    """What an agent says of its window: attributes of :class:`convoq.Agent` and of every
    :class:`~convoq.profile.AgentProfile`."""

    @property
    def keep_last_turns(self) -> int: ...

    @property
    def max_history_tokens(self) -> int | None: ...

    @property
    def token_counter(self) -> TokenCounter | None: ...

    @property
    def compaction(self) -> object | None: ...


@dataclass(frozen=True)
class WindowRule:
    """An agent's window precedence, the one place it is written: the in-process Agent,
    the worker's profiles (the windows turns are handed out with) and its runner decide by
    it. The scripts keep a copy for Redis (``turn_window()`` in ``redis/lua/_lib.lua``),
    held to this one case by case by ``tests/test_window_precedence.py``.

    1. A turn's own ``keep_last_turns`` beats its agent's, 0 included (0: every turn);
       its own ``max_history_tokens`` beats its agent's. Not given (None), the agent's
       applies.
    2. What is sent (:class:`Window`): the leading system/developer messages, a stored
       summary in place of the turns it covers, then the last ``keep_last_turns`` of the
       turns after it, of those the newest that fit the token budget.
    3. A window handed out with a worker's turn is counted in turns. A token budget (the
       turn's or its agent's), a compaction policy of the agent or a summary stored for
       the conversation makes the store choose the window instead, from the counts and
       the summary kept with the turns: the turn then comes with one turn of history.

    Attributes:
        keep_last_turns: the agent's (0: every turn).
        max_history_tokens: the agent's token budget (None: none).
        compacts: whether the agent has a compaction policy.
        counter: the agent's token counter (None: the default).
    """

    keep_last_turns: int = 0
    max_history_tokens: int | None = None
    compacts: bool = False
    counter: TokenCounter | None = None

    @classmethod
    def of(cls, agent: WindowSettings) -> WindowRule:
        """The rule of ``agent`` (its attributes read now)."""
        return cls(
            int(agent.keep_last_turns),
            agent.max_history_tokens,
            agent.compaction is not None,
            agent.token_counter,
        )

    @property
    def handed(self) -> int:
        """The window (turns, 0 = all) this agent's turns are handed out with, before a
        turn's own options or a summary are known: :data:`STORE_CHOOSES` when rule 3
        holds for every turn of the agent."""
        if self.max_history_tokens is not None or self.compacts:
            return STORE_CHOOSES
        return self.keep_last_turns

    def window(
        self, keep_last_turns: int | None = None, max_history_tokens: int | None = None
    ) -> Window:
        """What a turn that asks these (None: not asked) sends (rules 1 and 2)."""
        keep = self.keep_last_turns if keep_last_turns is None else keep_last_turns
        budget = self.max_history_tokens if max_history_tokens is None else max_history_tokens
        return Window(keep or None, budget, self.counter, with_summary=True)

    def for_turn(self, options: Mapping[str, Any], *, summarised: bool) -> TurnWindow:
        """A worker's turn, from the options stored with it (read as the scripts read
        them: a whole number >= 0, else not asked) and whether its conversation has a
        stored summary: what it sends and whether the store chooses that (rule 3)."""
        window = self.window(
            _asked(options.get("keep_last_turns")), _asked(options.get("max_history_tokens"))
        )
        chooses = window.max_tokens is not None or self.compacts or summarised
        return TurnWindow(window, store_chooses=chooses)


@dataclass(frozen=True)
class TurnWindow:
    """What a worker's turn sends, and where that comes from.

    Attributes:
        window: what the turn sends.
        store_chooses: the store chooses it (:class:`WindowRule`, rule 3), else it came
            with the turn.
    """

    window: Window
    store_chooses: bool

    @property
    def handed_turns(self) -> int:
        """The turns of history (0: all) the turn is handed out with."""
        return 1 if self.store_chooses else self.window.keep_last_turns or 0


def _asked(value: object) -> int | None:
    """An option's whole number >= 0, else None (not asked)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None
