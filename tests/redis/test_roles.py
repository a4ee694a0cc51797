"""The roles of the turn protocol (convoq.redis.roles) stay parts of TurnProtocol: every
method a role lists is the protocol's, with the same signature, every attribute it reads
is one a real protocol has, of the type the role says; each role is a proper part of the
whole; and each caller the roles' table names is typed against its role."""

from __future__ import annotations

import ast
import inspect
import typing
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from convoq.client import AsyncClient
from convoq.memory._loop_protocols import LoopProtocols
from convoq.memory._redis_holds import LeaseHolds
from convoq.memory.redis import RedisConversationMemory
from convoq.redis import roles
from convoq.redis._holding import commit_held, reserve, unreserve
from convoq.redis.protocol import TurnEvents, TurnProtocol
from convoq.redis.roles import (
    ClientStore,
    EventSink,
    HeldStore,
    LeaseStore,
    MemoryStore,
    RunnerStore,
    SweepStore,
    TurnReader,
    WorkerStore,
)
from convoq.worker import webhooks
from convoq.worker._event_loop import Opened
from convoq.worker._finished import after_turn
from convoq.worker._lease import TurnRun, turn_run
from convoq.worker.runner import Runner
from convoq.worker.runtime import WorkerRuntime
from convoq.worker.sweeper import Sweeper
from tests.support.protocol_helpers import open_protocol

ROLES = [
    EventSink,
    TurnReader,
    SweepStore,
    LeaseStore,
    RunnerStore,
    WorkerStore,
    ClientStore,
    HeldStore,
    MemoryStore,
]


def members(role: type) -> dict[str, Any]:
    """What a role lists, its own and its parents' (the typing machinery left out)."""
    found: dict[str, Any] = {}
    for cls in reversed(role.__mro__):
        if cls in (object, Protocol, typing.Generic):
            continue
        found.update({n: v for n, v in vars(cls).items() if not n.startswith("_")})
    return found


def role_names() -> dict[str, Any]:
    """The names the roles' annotations use: the module's own and those it imports for
    mypy only (read from its ``if TYPE_CHECKING:`` block, so the test follows the file)."""
    names = dict(vars(roles))
    tree = ast.parse(Path(roles.__file__).read_text())
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            exec(
                compile(ast.Module(body=node.body, type_ignores=[]), roles.__file__, "exec"), names
            )
    return names


@pytest.fixture
async def protocol(redis_server: Any, key_prefix: str) -> AsyncIterator[TurnProtocol]:
    async with open_protocol(str(redis_server.url), key_prefix) as proto:
        yield proto


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.__name__)
def test_every_method_of_a_role_is_the_protocols_with_its_signature(role: type) -> None:
    methods = {n: m for n, m in members(role).items() if not isinstance(m, property)}
    assert methods, f"{role.__name__} lists no method"
    for name, method in methods.items():
        assert hasattr(TurnProtocol, name), f"{role.__name__}.{name} is not TurnProtocol's"
        implemented = getattr(TurnProtocol, name)
        assert inspect.signature(method) == inspect.signature(implemented), (
            f"{role.__name__}.{name}{inspect.signature(method)} differs from "
            f"TurnProtocol.{name}{inspect.signature(implemented)}"
        )
        assert inspect.iscoroutinefunction(method) == inspect.iscoroutinefunction(implemented)


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.__name__)
async def test_every_attribute_a_role_reads_is_on_a_real_protocol_with_its_type(
    role: type, protocol: TurnProtocol
) -> None:
    names = role_names()
    for name, prop in members(role).items():
        if not isinstance(prop, property):
            continue
        assert prop.fget is not None
        wanted = inspect.signature(prop.fget, globals=names, eval_str=True).return_annotation
        value = getattr(protocol, name)
        assert isinstance(value, wanted), f"{role.__name__}.{name}: {value!r} is no {wanted}"


async def test_each_role_is_a_proper_part_of_the_whole(protocol: TurnProtocol) -> None:
    whole = {n for n in dir(TurnProtocol) if not n.startswith("_")}
    whole |= {n for n in vars(protocol) if not n.startswith("_")}
    for role in ROLES:
        listed = set(members(role))
        assert listed < whole, f"{role.__name__}: {sorted(listed - whole)} not the protocol's"
        assert len(listed) <= len(whole) // 2, f"{role.__name__} is most of the protocol"


def test_the_narrow_roles_are_parts_of_the_wide_ones() -> None:
    """What the runtime hands its parts, and the memory its held turns, it has itself."""
    for narrow, wide in [
        (EventSink, LeaseStore),
        (LeaseStore, RunnerStore),
        (TurnReader, RunnerStore),
        (RunnerStore, WorkerStore),
        (SweepStore, WorkerStore),
        (HeldStore, MemoryStore),
    ]:
        assert narrow in wide.__mro__
        assert set(members(narrow)) < set(members(wide))


def annotation(func: Any, parameter: str) -> str:
    found = inspect.signature(func).parameters[parameter].annotation
    return str(found)


def returned(prop: Any) -> str:
    return str(inspect.signature(prop.fget).return_annotation)


def test_each_caller_in_the_table_is_typed_against_its_role() -> None:
    assert annotation(TurnEvents.__init__, "protocol") == "EventSink"
    assert annotation(webhooks.deliver, "protocol") == "TurnReader"
    assert annotation(after_turn, "protocol") == "TurnReader"
    assert annotation(Sweeper.__init__, "protocol") == "SweepStore"
    assert annotation(turn_run, "protocol") == "LeaseStore"
    assert TurnRun.__annotations__["protocol"] == "LeaseStore"
    assert annotation(Runner.__init__, "protocol") == "RunnerStore"
    assert returned(WorkerRuntime.protocol) == "WorkerStore"
    assert Opened.__annotations__["protocol"] == "WorkerStore"
    assert returned(AsyncClient.protocol) == "ClientStore"
    for held in (reserve, unreserve, commit_held):
        assert annotation(held, "proto") == "HeldStore"
    assert annotation(LeaseHolds.take, "proto") == "MemoryStore"
    assert str(inspect.signature(LoopProtocols.current).return_annotation) == "MemoryStore"
    assert annotation(RedisConversationMemory._run, "call") == (
        "Callable[[MemoryStore], Awaitable[T]]"
    )
