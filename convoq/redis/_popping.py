"""Removing a conversation's newest message on Redis: the ``pop`` script, O(1) in the
history's length.

The newest message is the last one of the last element of the turns list (of the lead
list while no turn is stored). The client reads that element alone, decodes it, and
encodes what stays of it (the element less its newest message, plus what ``keep`` puts
in its place); the script then drops or replaces exactly that element, only if it is
still the one read (else the client reads again) and only while no turn holds the
conversation's lease or waits in its inbox (else the pop waits like any writer, up to
``wait_s``). Nothing reads or rewrites the rest of the history.

Attachments: the blobs hash stores each attachment once per conversation, and elements
say which they refer to only in their own headers, so whether another element still
refers to an attachment of the popped message could only be told by reading every
element. The pop therefore leaves them in the hash (counted in the meta ``bytes``):
``prune`` drops every attachment no element refers to, ``clear``/``delete`` and the idle
TTL drop them all, and a pop that leaves the conversation empty drops them at once. An
attachment added again after a pop (an edited message re-sent) reuses the stored copy.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from typing import Any

from convoq._sync import adrive
from convoq.errors import ConversationBusyError
from convoq.ids import check_conversation_id
from convoq.limits import Limits
from convoq.messages import Message
from convoq.redis._codec import (
    FORMAT_VERSION,
    Encoded,
    decode_elements,
    encode_element,
    parse_header,
    text,
)
from convoq.redis._decoded import forget
from convoq.redis._history import APPEND_ID_TTL_MS, _blobs_steps, _raise_stored_errors
from convoq.redis._holding import BusyWait
from convoq.redis._refusals import refusal_error, version_error
from convoq.redis._replies import Outcome
from convoq.redis._retention import RetentionMixin
from convoq.redis.keys import KeySchema
from convoq.redis.scripts import Batch, ScriptCall, Steps

Keep = Callable[[Message], list[Message]]
"""Given the newest message, the messages stored in its place ([]: nothing)."""

# A busy conversation is asked again after this long, doubling up to the cap: the first
# looks come soon, since a session's append holds the lease for two round trips only.
_FIRST_POLL_S, _MAX_POLL_S = 0.002, 0.25


class _Again:
    """The element read is no longer the last one (or held no message): read again."""


AGAIN = _Again()


def pop_keys(keys: KeySchema, cid: str, pop_id: str) -> list[str]:
    """The pop script's KEYS (see ``pop.lua``)."""
    script_keys = [*keys.history_keys(cid), keys.applied(cid, pop_id)]
    return [*script_keys, keys.inbox(cid), keys.lease(cid), keys.summary(cid)]


def pop_steps(
    keys: KeySchema, cid: str, limits: Limits, keep: Keep | None, *, pop_id: str
) -> Steps[Message | _Again | None]:
    """One try at removing the newest message: it (None: nothing stored), or AGAIN.

    Raises:
        ConversationBusyError: a turn holds the conversation or is queued (nothing
            changed).
    """
    place, element, messages, stored = yield from _newest_element(keys, cid)
    newest = messages[-1] if messages else None
    rest = messages[:-1] + (keep(newest) if keep and newest else [])
    encoded = Encoded()
    replacement = encode_element(rest, limits, encoded) if rest else b""
    args: list[Any] = [APPEND_ID_TTL_MS, place, hashlib.sha1(element).hexdigest(), replacement]
    # Attachments the old element referred to are stored already; only new ones are sent.
    args += [x for sha, data in encoded.blobs.items() if sha not in stored for x in (sha, data)]
    reply = Outcome.parse("pop", (yield ScriptCall("pop", pop_keys(keys, cid, pop_id), args)))
    if reply.refusal is not None:
        raise refusal_error(reply.refusal, keys, cid, None)
    forget(keys.base(cid))  # the element it replaced, decoded here, goes too
    if reply.status == "EMPTY":
        return None
    if reply.status == "CHANGED" or newest is None:
        return AGAIN  # an element of no message went; the newest is in the one before
    return newest  # OK, or APPLIED: a resend of this very pop


def _newest_element(
    keys: KeySchema, cid: str
) -> Steps[tuple[str, bytes, list[Message], dict[str, bytes]]]:
    """Where the newest message is ('turns', 'lead', or 'none' with b""), the element
    holding it, that element's messages and the attachments it refers to."""
    meta, turns_key, lead_key = keys.meta(cid), keys.turns(cid), keys.lead(cid)
    replies = yield Batch(
        [
            ("HGET", meta, "format_version"),
            ("LLEN", turns_key),
            ("LINDEX", turns_key, -1),
            ("LINDEX", lead_key, -1),
        ],
        transaction=True,
    )
    _raise_stored_errors(replies, [meta, turns_key, turns_key, lead_key])
    version, stored_turns, last_turn, last_lead = replies
    if version is not None and text(version) != str(FORMAT_VERSION):
        raise version_error(keys, cid, text(version))
    place, key, element = (
        ("turns", turns_key, last_turn) if stored_turns else ("lead", lead_key, last_lead)
    )
    if element is None:
        return "none", b"", [], {}
    header = parse_header(element, key=key)
    blobs = yield from _blobs_steps(keys, cid, list(header.blobs))
    messages = decode_elements([header], blobs, key=key, blobs_key=keys.blobs(cid))
    return place, element, messages, blobs


class PoppingMixin(RetentionMixin):
    """pop (over touch: a pop starts the idle TTL afresh, as an append does)."""

    async def pop(
        self, cid: str, *, keep: Keep | None = None, wait_s: float = 0.0
    ) -> Message | None:
        """Remove the conversation's newest message and return it (None: nothing stored),
        waiting up to ``wait_s`` seconds while a turn holds the conversation (runs, is
        queued or awaits approval). See the module docstring.

        Raises:
            ConversationBusyError: a turn still held it after ``wait_s`` (nothing changed).
        """
        check_conversation_id(cid)
        busy_wait = BusyWait(wait_s, _FIRST_POLL_S, _MAX_POLL_S)
        # One id for every try: only the try that writes records it, so a resend of that
        # try's script (its reply lost) answers APPLIED instead of popping again.
        pop_id = secrets.token_hex(16)
        while True:
            steps = pop_steps(self.keys, cid, self.limits, keep, pop_id=pop_id)
            try:
                popped = await adrive(steps, self.scripts.perform)
            except ConversationBusyError as busy:
                await busy_wait.pause(busy)
                continue
            if popped is not AGAIN:
                await self.touch(cid, also=[self.keys.applied(cid, pop_id)])
                return popped if isinstance(popped, Message) else None
