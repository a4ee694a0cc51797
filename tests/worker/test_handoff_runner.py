"""The runner's side of handoffs in this process, against a real redis-server: a turn
handed to a profile another pool serves is left queued for it (the lease freed, the kick
sent to that pool's queues), and a turn for a profile this worker does not serve, whose
pool it does not consume, is passed on unrun."""

from __future__ import annotations

from typing import Any

from convoq import Agent, Message, ToolCall
from convoq.models import ScriptedModel
from convoq.redis import TurnProtocol
from convoq.worker.profiles import Profiles
from convoq.worker.runner import Runner, RunnerConfig

CID = "handing"


def _runner(proto: TurnProtocol, kicked: list[tuple[str, str]], kick: Any = None) -> Runner:
    def model(request: object) -> Message:
        return Message.assistant("", [ToolCall(id="h", name="transfer_to_billing", arguments={})])

    triage = Agent(ScriptedModel(model), name="triage", handoffs=["billing"])

    async def kicked_to(cid: str, agent: str) -> None:
        kicked.append((cid, agent))

    config = RunnerConfig(worker_id="w-test", lease_ms=5_000)
    return Runner(
        proto, Profiles([triage]), config, kick_agent=kick or kicked_to,
        consumed_here=lambda cid, agent: agent == "triage",
    )  # fmt: skip


async def test_a_turn_handed_to_another_pool_is_left_queued_for_it(proto: TurnProtocol) -> None:
    kicked: list[tuple[str, str]] = []
    await proto.submit(CID, "t1", agent="triage", message=Message.user("bill me"), options={})
    report = await _runner(proto, kicked).drain(CID)
    assert (report.requeued, report.succeeded, report.abandoned) == (["t1"], [], [])
    assert kicked == [(CID, "billing")]
    record = await proto.get_turn(CID, "t1")
    assert (record.status, record.agent, record.handed_from) == ("running", "billing", "triage")
    assert await proto.redis.exists(proto.keys.lease(CID)) == 0  # free for billing's pool
    assert await proto.head_agent(CID) == "billing"
    # A worker of this pool that takes it again passes it on unrun.
    again = await _runner(proto, kicked).drain(CID)
    assert again.requeued == ["t1"] and kicked == [(CID, "billing")] * 2


async def test_a_kick_lost_after_the_move_leaves_the_turn_to_the_sweeper(
    proto: TurnProtocol,
) -> None:
    """The worker dies (here: its kick fails) between the move and the kick: the turn is a
    head without a lease, which the sweeper kicks on the queue of the agent it names."""
    failing = _runner(proto, [], kick=_broken_kick)
    await proto.submit(CID, "t2", agent="triage", message=Message.user("bill me"), options={})
    report = await failing.drain(CID)
    assert report.requeued == ["t2"]
    assert CID in await proto.sweep_candidates()
    assert await proto.head_agent(CID) == "billing"  # what the sweeper routes its kick by


async def _broken_kick(cid: str, agent: str) -> None:
    raise ConnectionError("the broker is gone")
