"""Every Redis key name convoq uses, and nothing else spells one.

All keys of one conversation share the hash tag ``{cid}``, so each Lua script touches a
single Redis Cluster slot. Conversation and turn ids pass the checks of :mod:`convoq.ids`
before a key is built; a conversation id appears encoded (:func:`convoq.ids.key_part`:
``%XX`` for anything but ``A-Za-z0-9._:@/+=-``, so ``{``, ``}``, ``*`` or a space can
never break the hash tag or a SCAN pattern); idempotency keys are hashed (sha256 hex) so
any string may be one.

::

    {prefix}:{cid}:meta            hash    format_version, turns, bytes, last_turn_id, fence, lead
    {prefix}:{cid}:turns           list    one JSON element per stored turn (blob refs)
    {prefix}:{cid}:lead            list    leading system/developer messages (JSON elements)
    {prefix}:{cid}:blobs           hash    sha256 hex -> raw attachment bytes
    {prefix}:{cid}:summary         hash    rolling summary: text, watermark (turns covered)
    {prefix}:{cid}:inbox           list    queued turn ids, FIFO; the head is being run
    {prefix}:{cid}:timers          zset    scheduled turn id -> due ms (fire.lua queues them)
    {prefix}:{cid}:lease           hash    holder, fence, state, expires_ms (PX expiry)
    {prefix}:{cid}:swept           string  the sweeper's last kick of the inbox head (PX)
    {prefix}:{cid}:turn:{tid}      hash    the turn record
    {prefix}:{cid}:cont:{tid}      string  continuation of a parked turn (TurnState JSON)
    {prefix}:{cid}:journal:{tid}   string  step checkpoint of a running turn (TurnState JSON)
    {prefix}:{cid}:events:{tid}    stream  status changes, deltas, tool calls, done
    {prefix}:{cid}:reader:{tid}    string  set (PX) while someone reads the events live
    {prefix}:{cid}:idem:{sha256}   string  idempotency key -> first turn id
    {prefix}:{cid}:signal:{sha256} list    signals of one name kept for the next wait (TTL)
    {prefix}:{cid}:signals:seen    zset    signal ids handled (score: when they are forgotten)
    {prefix}:{cid}:append:{id}     string  a memory append or pop applied (replay guard, TTL)
    {prefix}:{cid}:spent:{token}   string  a continuation already resumed or discarded (TTL)
    {prefix}:{cid}:acked           string  replication probe of min_replicas_acked (TTL)
    {prefix}:epoch                 string  the dataset epoch marker
    convoq:registry:prefixes       set     prefixes workers run under (all deployments)
    {prefix}:registry:agents       set     agent profile names the workers run
    {prefix}:registry:workers      hash    worker name -> JSON (pid, queues, agents, seen_ms)
    {prefix}:registry:retention    hash    the TTLs the workers keep turns and conversations
    {prefix}:registry:sweeper      string  short lock: one sweep per period across workers
    {prefix}:{~queued}:members     hash    "cid tid" -> "admitted_ms agent" of admitted turns
    {prefix}:{~queued}:counts      hash    agent -> turns admitted, "*" -> all of them
    {prefix}:{~queued}:cursor      string  where the reconciling HSCAN goes on
    {prefix}:{~timers}:due         zset    encoded cid -> its earliest due timer, ms

The keys from the epoch marker on are deployment-wide, outside any conversation. They can
never equal a conversation key: those always carry a ``{cid}`` hash tag right after the
prefix, and an encoded conversation id never contains ``~``. The ``{~queued}`` keys share
one hash tag (one Cluster slot) so the admission scripts touch them together.
"""

from __future__ import annotations

import hashlib
import re

from convoq import defaults
from convoq.errors import ConfigurationError
from convoq.ids import check_turn_id, from_key_part, key_part

# Glob and hash-tag characters would make patterns and slots ambiguous.
_PREFIX = re.compile(r"[A-Za-z0-9._:@/+=-]{1,64}")


class KeySchema:
    """Key names under one prefix (tests use a random prefix each)."""

    def __init__(self, prefix: str = defaults.PREFIX) -> None:
        if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
            raise ConfigurationError(
                f"invalid key prefix {prefix!r}: use 1-64 characters of"
                " A-Z a-z 0-9 . _ : @ / + = -",
                prefix=repr(prefix)[:80],
            )
        self.prefix = prefix

    def base(self, cid: str) -> str:
        """``{prefix}:{cid}``: the part every key of the conversation starts with."""
        return f"{self.prefix}:{{{key_part(cid)}}}"

    def meta(self, cid: str) -> str:
        return f"{self.base(cid)}:meta"

    def turns(self, cid: str) -> str:
        return f"{self.base(cid)}:turns"

    def lead(self, cid: str) -> str:
        return f"{self.base(cid)}:lead"

    def blobs(self, cid: str) -> str:
        return f"{self.base(cid)}:blobs"

    def summary(self, cid: str) -> str:
        return f"{self.base(cid)}:summary"

    def inbox(self, cid: str) -> str:
        return f"{self.base(cid)}:inbox"

    def timers(self, cid: str) -> str:
        """Sorted set of the conversation's scheduled turns: turn id -> due ms."""
        return f"{self.base(cid)}:timers"

    def lease(self, cid: str) -> str:
        return f"{self.base(cid)}:lease"

    def swept(self, cid: str) -> str:
        """The sweeper's note of its last kick of the inbox head: ``"attempt hold_ms
        tid"``, living twice ``hold_ms``; while more than ``hold_ms`` of it is left, the head
        is not kicked again (see :mod:`convoq.redis._sweeping`)."""
        return f"{self.base(cid)}:swept"

    def turn(self, cid: str, tid: str) -> str:
        return f"{self.base(cid)}:turn:{check_turn_id(tid)}"

    def cont(self, cid: str, tid: str) -> str:
        return f"{self.base(cid)}:cont:{check_turn_id(tid)}"

    def journal(self, cid: str, tid: str) -> str:
        return f"{self.base(cid)}:journal:{check_turn_id(tid)}"

    def events(self, cid: str, tid: str) -> str:
        return f"{self.base(cid)}:events:{check_turn_id(tid)}"

    def reader(self, cid: str, tid: str) -> str:
        return f"{self.base(cid)}:reader:{check_turn_id(tid)}"

    def applied(self, cid: str, append_id: str) -> str:
        """Marks a memory append (or pop) as done, so a resent one writes nothing."""
        return f"{self.base(cid)}:append:{check_turn_id(append_id)}"

    def spent(self, cid: str, token: str) -> str:
        """Marks an in-process turn's continuation as used: it cannot run twice."""
        return f"{self.base(cid)}:spent:{check_turn_id(token)}"

    def acked(self, cid: str) -> str:
        """Written (with a short TTL) after a write that must reach replicas, so ``WAIT``
        has a write of its own connection to wait for (see ``redis/_durable.py``)."""
        return f"{self.base(cid)}:acked"

    def idem(self, cid: str, key: str) -> str:
        digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
        return f"{self.base(cid)}:idem:{digest}"

    def signals(self, cid: str, name: str) -> str:
        """The signals named ``name`` kept for the conversation's next wait on it."""
        digest = hashlib.sha256(name.encode("utf-8")).hexdigest()
        return f"{self.base(cid)}:signal:{digest}"

    def signals_seen(self, cid: str) -> str:
        """The ids of the conversation's signals handled lately (a resend writes nothing)."""
        return f"{self.base(cid)}:signals:seen"

    def epoch(self) -> str:
        """The global epoch marker; not part of any conversation (see ``check_epoch``)."""
        return f"{self.prefix}:epoch"

    def agents(self) -> str:
        """Set of the agent profile names the workers run (clients check names against it)."""
        return f"{self.prefix}:registry:agents"

    def owed_callbacks(self) -> str:
        """Sorted set of the callbacks workers owe (JSON ``[cid, tid]`` -> when due again,
        ms); see :mod:`convoq.worker._owed_callbacks`."""
        return f"{self.prefix}:callbacks:owed"

    def workers(self) -> str:
        """Hash worker name -> JSON (pid, queues, agents, started_ms, seen_ms) of the
        workers; ``seen_ms`` is refreshed every sweep period, so a stale entry is a dead
        worker."""
        return f"{self.prefix}:registry:workers"

    def retention(self) -> str:
        """Hash of the retention the workers run with (``turn_ttl_ms``,
        ``conversation_ttl_ms``, 0 for none): every process writing keys of a conversation
        gives them these TTLs (see :mod:`convoq.redis._retention`)."""
        return f"{self.prefix}:registry:retention"

    @staticmethod
    def prefixes() -> str:
        """Set of the prefixes workers run under, shared by every deployment on this Redis:
        a client whose prefix has no workers can name the ones that do."""
        return "convoq:registry:prefixes"

    def sweeper_lock(self) -> str:
        """Short lock so one worker process per sweep period scans for stranded turns."""
        return f"{self.prefix}:registry:sweeper"

    def queue_keys(self) -> list[str]:
        """members, counts, cursor: the deployment-wide queued-turn counters (one slot)."""
        base = f"{self.prefix}:{{~queued}}"
        return [f"{base}:members", f"{base}:counts", f"{base}:cursor"]

    def timer_index(self) -> str:
        """Sorted set, deployment-wide: encoded conversation id -> the due ms of its
        earliest timer (or earlier: an entry may run ahead, never behind, of its
        conversation's ``timers``); what the timer poll reads."""
        return f"{self.prefix}:{{~timers}}:due"

    def timers_pattern(self) -> str:
        """Glob for SCAN over every conversation's timers (the index's repair)."""
        return f"{self.prefix}:{{*}}:timers"

    def conversation_of_timers(self, key: str | bytes) -> str | None:
        """The conversation id of a timers key found by SCAN, or None if it is not one."""
        text = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
        head, tail = f"{self.prefix}:{{", "}:timers"
        if not (text.startswith(head) and text.endswith(tail)):
            return None
        return from_key_part(text[len(head) : -len(tail)])

    def history_keys(self, cid: str) -> list[str]:
        """meta, turns, blobs, lead: what the history scripts take as KEYS[1..4]."""
        return [self.meta(cid), self.turns(cid), self.blobs(cid), self.lead(cid)]

    def retained_keys(self, cid: str) -> list[str]:
        """meta, turns, blobs, lead, summary: what outlives a turn (the idle TTL's keys)."""
        return [*self.history_keys(cid), self.summary(cid)]

    def turn_keys(self, cid: str, tid: str) -> list[str]:
        """turn, journal, cont, events: the per-turn keys of ``tid``."""
        return [
            self.turn(cid, tid),
            self.journal(cid, tid),
            self.cont(cid, tid),
            self.events(cid, tid),
        ]

    def inbox_pattern(self) -> str:
        """Glob for SCAN over every conversation's inbox (the sweeper)."""
        return f"{self.prefix}:{{*}}:inbox"

    def conversation_pattern(self, cid: str) -> str:
        """Glob for SCAN over every key of one conversation (clear)."""
        return f"{self.base(cid)}:*"

    def conversation_of_inbox(self, key: str | bytes) -> str | None:
        """The conversation id of an inbox key found by SCAN, or None if it is not one."""
        text = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
        head, tail = f"{self.prefix}:{{", "}:inbox"
        if not (text.startswith(head) and text.endswith(tail)):
            return None
        return from_key_part(text[len(head) : -len(tail)])
