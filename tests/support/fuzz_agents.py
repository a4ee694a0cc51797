"""The agents a fuzzed gateway serves: each answers at once (an echo, a failure, a
refusal, a tool call with usage) or parks for approval at once (so a fuzzer following the
document's links decides a real pending call). Every turn a fuzzer queues ends or settles,
and every stream it follows through a link (``until=settled``) closes. None blocks, sleeps
or kills its worker."""

from tests.support.worker_agents import approver, echo, failer, metered, refuser

__all__ = ["approver", "echo", "failer", "metered", "refuser"]
