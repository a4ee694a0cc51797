"""The agents a fuzzed gateway serves: each answers at once (an echo, a failure, a
refusal, a tool call with usage), so every turn a fuzzer queues ends and every event
stream it opens closes. None parks for approval (a parked turn's stream stays open until
someone decides, which a client reading whole bodies would wait out), blocks, sleeps or
kills its worker."""

from tests.support.worker_agents import echo, failer, metered, refuser

__all__ = ["echo", "failer", "metered", "refuser"]
