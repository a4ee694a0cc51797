"""The agents a fuzzed gateway serves: each answers at once (an echo, a failure, a
refusal, a tool call with usage) or parks for approval at once (so a fuzzer following the
document's links decides a real pending call). Every turn a fuzzer queues ends or settles,
and every stream it follows through a link (``until=settled``) closes. None blocks, sleeps
or kills its worker.

The approver's approvals expire after a few seconds: a fuzzer reuses conversation ids, and
a turn parked for ever would hold every later turn of its conversation in line, so no
later scenario there would see a turn parked (to decide) or failed (to retry)."""

from convoq import Agent
from convoq.models import ScriptedModel
from tests.support.worker_agents import approver_fn, echo, failer, metered, refuser, transfer

APPROVAL_TTL_S = 3.0

approver = Agent(
    ScriptedModel(approver_fn), name="approver", tools=[transfer], approval_ttl_s=APPROVAL_TTL_S
)

__all__ = ["approver", "echo", "failer", "metered", "refuser"]
