"""Reading a conversation: its stored messages (``history``, or their JSON as stored:
``history_json``), the messages a window sends (``window``) and what its turns used
(``usage``). Reads take no lease."""

from __future__ import annotations

from convoq._sync import adrive
from convoq.errors import ConvoqError
from convoq.ids import check_conversation_id
from convoq.messages import Message
from convoq.redis._base import ProtocolBase
from convoq.redis._budget import budget_steps
from convoq.redis._counted import counted_steps
from convoq.redis._history import load_history
from convoq.redis._raw import StoredJson, json_steps
from convoq.usage import COUNTER_FIELDS, Usage, counters_to_usage
from convoq.window import Window


class ReadingMixin(ProtocolBase):
    """``history``, ``history_json``, ``window``, ``usage``."""

    async def history(self, cid: str, *, last_turns: int | None = None) -> list[Message]:
        """Stored messages: the leading system/developer ones plus the last N turns."""
        check_conversation_id(cid)
        if last_turns is not None and last_turns < 0:
            raise ConvoqError("last_turns must be >= 0 (0 or None loads the whole history)")
        return await load_history(self.scripts, self.keys, cid, last_turns)

    async def history_json(self, cid: str, *, last_turns: int | None = None) -> StoredJson:
        """:meth:`history` as the stored JSON, passed through without decoding it (see
        :mod:`convoq.redis._raw`): for a reader that only forwards it."""
        check_conversation_id(cid)
        if last_turns is not None and last_turns < 0:
            raise ConvoqError("last_turns must be >= 0 (0 or None loads the whole history)")
        return await adrive(json_steps(self.keys, cid, last_turns), self.scripts.perform)

    async def window(self, cid: str, window: Window) -> list[Message]:
        """The stored messages ``window`` sends. A token budget with the default counter
        is chosen from the counts stored with each turn, reading only the window; another
        counter counts the turns read from the newest back until the budget is spent (or,
        ``with_summary``, the summary's watermark is reached)."""
        check_conversation_id(cid)
        if window.max_tokens is not None and not window.default_counter:
            counted = counted_steps(self.keys, cid, window)  # a counter of the caller's own
            return window.apply(await adrive(counted, self.scripts.perform))
        if window.max_tokens is not None or window.with_summary:
            keep = window.keep_last_turns or 0
            steps = budget_steps(self.keys, cid, window.max_tokens, keep, window.with_summary)
            return window.apply(await adrive(steps, self.scripts.perform))
        # Exactly the window already: the last N whole turns, nothing to trim.
        return await load_history(self.scripts, self.keys, cid, window.keep_last_turns)

    async def usage(self, cid: str) -> Usage:
        """What the conversation's committed turns reported, summed: one read of its meta
        hash, whatever the history's length (commit adds each turn's usage there)."""
        fields = list(COUNTER_FIELDS.values())
        values = await self.redis.hmget(self.keys.meta(cid), fields)
        return counters_to_usage(dict(zip(fields, values, strict=True)))
