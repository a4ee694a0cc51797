"""``/v1/workers``: the workers behind the gateway's Redis and prefix, and the backlog of
each partition, for the console's workers page.

A worker's entry (its registry entry, judged alive by its heartbeats: see
:mod:`convoq.redis._registry`) gives its queues, the profiles it serves and its slots;
the turns it runs now (its slots in use) are the active leases it holds. The backlog
comes from one bounded SCAN of the inboxes (as the sweeper's inbox depth gauge): turns
queued, running and parked per partition. A key with a conversation prefix sees only its
conversations in these counts; the workers themselves are the deployment's, shown to
any key with the read scope.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from convoq.gateway.auth import Access, Principal
from convoq.gateway.bodies import GatewayRoute
from convoq.gateway.console_models import (
    MCPServerHealth,
    PartitionBacklog,
    WorkersView,
    WorkerView,
)
from convoq.gateway.document import KEYED, errors
from convoq.gateway.routes_turns import AppClient
from convoq.queue.routing import partition_of, queue_name
from convoq.redis._browse import Backlog, Browse

router = APIRouter(tags=["console"], route_class=GatewayRoute, responses=errors(*KEYED))


@router.get(
    "/v1/workers",
    response_model=WorkersView,
    summary="Workers, alive or not, and the backlog per partition (scope: read)",
)
async def workers(
    client: AppClient, principal: Annotated[Principal, Depends(Access("read"))]
) -> WorkersView:
    """Each registered worker (alive or not, by its heartbeats) with its queues, profiles,
    slots and the turns it runs now; per partition the turns queued, running and parked
    (of the conversations the key may reach)."""
    registered = await client.workers()
    partitions = client.partitions
    store = client.protocol
    backlog = await Browse(store.redis, store.keys).backlog(
        lambda cid: partition_of(cid, partitions), principal.conversation_prefix
    )
    shown = [_worker(name, info, backlog) for name, info in sorted(registered.items())]
    ids = {w.worker_id for w in shown if w.worker_id}
    return WorkersView(
        workers=shown,
        partitions=[_partition(client.prefix, p, backlog) for p in range(partitions)],
        elsewhere=sum(n for holder, n in backlog.holders.items() if holder not in ids),
        complete=backlog.complete,
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _worker(name: str, info: dict[str, Any], backlog: Backlog) -> WorkerView:
    worker_id = info.get("worker_id") if isinstance(info.get("worker_id"), str) else None
    queues, agents = info.get("queues"), info.get("agents")
    return WorkerView(
        name=name,
        alive=bool(info.get("alive")),
        last_seen=info.get("last_seen"),
        last_seen_s=info.get("last_seen_s"),
        pid=_int(info.get("pid")),
        worker_id=worker_id or None,
        queues=[str(q) for q in queues] if isinstance(queues, list) else [],
        partitions=_int(info.get("partitions")),
        agents=[str(a) for a in agents] if isinstance(agents, list) else [],
        concurrency=_int(info.get("concurrency")),
        running=backlog.holders.get(worker_id, 0) if worker_id else 0,
        started_ms=_int(info.get("started_ms")),
        mcp=_mcp(info.get("mcp")),
    )


def _mcp(report: Any) -> list[MCPServerHealth]:
    """The MCP servers of a worker's entry (``convoq.mcp.health`` as its heartbeat wrote
    it), by name; anything else in the entry is left out."""
    if not isinstance(report, dict):
        return []
    shown = []
    for name, entry in sorted(report.items()):
        if isinstance(entry, dict):
            error, tools = entry.get("error"), entry.get("tools")
            shown.append(MCPServerHealth(
                name=str(name), state=str(entry.get("state") or "unknown"), tools=_int(tools),
                error=error if isinstance(error, str) else None,
            ))  # fmt: skip
    return shown


def _partition(prefix: str, partition: int, backlog: Backlog) -> PartitionBacklog:
    return PartitionBacklog(
        partition=partition,
        queue=queue_name(prefix, partition),
        queued=backlog.queued.get(partition, 0),
        running=backlog.running.get(partition, 0),
        parked=backlog.parked.get(partition, 0),
    )
