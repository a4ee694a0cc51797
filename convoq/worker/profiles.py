"""Agent profiles: the named agents a worker can run (see :mod:`convoq.profile`).

A profile module is any importable module (``CONVOQ_AGENTS=myapp.agents`` or
``convoq worker --agents myapp.agents``); every named :class:`~convoq.profile.AgentProfile`
among its attributes is a profile (a :class:`convoq.Agent`, or a framework's agent an
integration wrapped). A framework's own named agent found there is wrapped by the
integration registered for its package under the ``convoq.profiles`` entry points (the
worker never imports the integrations). Several modules may be given, separated by commas.
As with ``celery -A``, the working directory is on the import path: ``myapp/`` beside
where the worker starts imports without setting ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from importlib.metadata import entry_points
from typing import Any

from convoq.errors import ConfigurationError, UnknownAgentError
from convoq.handoffs import handoffs_of
from convoq.profile import AgentProfile, approval_ttl_of, refusals_of
from convoq.tools import ToolRegistry
from convoq.window import STORE_CHOOSES, AgentWindows, WindowRule
from convoq.worker._subagents import check_subagents

ADAPTERS_GROUP = "convoq.profiles"
"""Entry points named after a framework's top package; each loads a function that makes a
profile of that framework's agent (or returns None for objects it does not adapt)."""


class Profiles(Mapping[str, AgentProfile]):
    """The profiles of a worker, by name.

    Raises:
        ConfigurationError: a profile without a name, two with one name, or a profile
            that sets an option workers cannot honour (named, with what to do instead).
    """

    def __init__(self, agents: Iterable[AgentProfile]) -> None:
        self._agents: dict[str, AgentProfile] = {}
        for agent in agents:
            if agent.name is None:
                raise ConfigurationError("an agent profile needs a name: Agent(..., name='...')")
            check_servable(agent)
            other = self._agents.get(agent.name)
            if other is not None and other is not agent:
                raise ConfigurationError(f"two agent profiles are named {agent.name!r}")
            self._agents[agent.name] = agent
        # Sub-agents given as agents are served too; one named only must be a profile.
        for extra in check_subagents(self._agents):
            check_servable(extra)
            self._agents[str(extra.name)] = extra
        # Handoff targets given as agents are served too (one named only may be served
        # by another pool: CONVOQ_AGENT_POOLS).
        for extra in handoff_agents(self._agents):
            check_servable(extra)
            self._agents[str(extra.name)] = extra
        # Each profile's window rule, decided once: the windows its turns are handed out
        # with and the window its runner then sends come from the same decision.
        self._rules = {name: WindowRule.of(agent) for name, agent in self._agents.items()}

    def __getitem__(self, name: str) -> AgentProfile:
        return self._agents[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._agents)

    def __len__(self) -> int:
        return len(self._agents)

    def get_profile(self, name: str) -> AgentProfile:
        """The profile called ``name``.

        Raises:
            UnknownAgentError: no profile has that name (the known names are listed).
        """
        agent = self._agents.get(name)
        if agent is None:
            raise UnknownAgentError(
                f"no agent profile named {name!r}; this worker knows {sorted(self._agents)}",
                agent=name,
                known=sorted(self._agents),
            )
        return agent

    def windows(self) -> AgentWindows:
        """The history window each profile's turns are handed out with, decided here once
        (:attr:`WindowRule.handed <convoq.window.WindowRule.handed>`). A turn for an agent
        this worker does not know fails, so it brings one turn only."""
        return AgentWindows(
            {name: rule.handed for name, rule in self._rules.items()},
            default=STORE_CHOOSES,
        )

    def window_rule(self, name: str) -> WindowRule:
        """The window rule of the profile called ``name`` (see :meth:`get_profile`)."""
        self.get_profile(name)
        return self._rules[name]

    def approval_ttls_ms(self, default_s: float) -> dict[str, int]:
        """How long a parked turn of each profile waits for its decisions, in ms: its own
        ``approval_ttl_s``, else ``default_s`` (the worker's ``CONVOQ_APPROVAL_TTL_S``);
        decided here once, like :meth:`windows`."""
        ttls: dict[str, int] = {}
        for name, agent in self._agents.items():
            own = approval_ttl_of(agent)
            ttls[name] = max(1, round((default_s if own is None else own) * 1000))
        return ttls


def handoff_agents(profiles: Mapping[str, AgentProfile]) -> list[AgentProfile]:
    """The agents the profiles hand off to that are no profile of their own yet."""
    added: dict[str, AgentProfile] = {}
    todo = list(profiles.values())
    while todo:
        for tool in handoffs_of(getattr(todo.pop(), "tools", None)).values():
            agent = tool.agent
            known = profiles.get(tool.profile)
            if known is not None and not isinstance(getattr(known, "tools", None), ToolRegistry):
                raise ConfigurationError(
                    f"profile {tool.profile!r} is handed off to (handoffs), but only a convoq"
                    " Agent profile can take a handed-off turn (not an integrated"
                    " framework's agent)",
                    option="handoffs",
                    profile=tool.profile,
                )
            if known is not None or tool.profile in added:
                continue
            if isinstance(agent, AgentProfile):
                added[tool.profile] = agent
                todo.append(agent)
    return list(added.values())


def check_servable(agent: AgentProfile) -> None:
    """Refuse a profile that sets options a worker cannot honour (never dropped silently).

    Raises:
        ConfigurationError: naming the profile, each such option and what to do instead.
    """
    refused = refusals_of(agent)
    if refused:
        why = "; ".join(f"{option}: {reason}" for option, reason in refused.items())
        raise ConfigurationError(
            f"agent profile {agent.name!r} sets {sorted(refused)}, which workers cannot"
            f" honour ({why}); leave them out of the profile the workers run",
            profile=agent.name,
            options=sorted(refused),
        )


def load_profiles(modules: str | None) -> Profiles:
    """Import ``modules`` (comma separated) and collect their named ``Agent`` objects.

    Raises:
        ConfigurationError: nothing to import, an import error, or no named Agent found.
    """
    names = [m.strip() for m in (modules or "").split(",") if m.strip()]
    if not names:
        raise ConfigurationError(
            "no agent profiles: set CONVOQ_AGENTS=myapp.agents or pass --agents myapp.agents"
        )
    _import_from_working_directory()
    found: list[AgentProfile] = []
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise ConfigurationError(
                f"cannot import agent module {name!r}: {exc}; check CONVOQ_AGENTS/--agents"
                " and that the module is on the Python path",
                module=name,
            ) from exc
        found.extend(_profiles_in(vars(module).values()))
    if not found:
        raise ConfigurationError(
            f"no named Agent in {names}: define e.g. assistant = Agent(model, name='assistant')"
        )
    return Profiles(found)


def _import_from_working_directory() -> None:
    # An installed console script puts only its own bin/ on sys.path; celery -A and
    # python -m put the working directory first, so a worker does the same.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def _profiles_in(values: Iterable[Any]) -> list[AgentProfile]:
    """The named profiles among ``values``, then the framework agents an adapter wraps
    (unless a profile of that name is there already, e.g. the agent wrapped explicitly)."""
    adapters = {ep.name: ep for ep in entry_points(group=ADAPTERS_GROUP)}
    explicit: list[AgentProfile] = []
    adapted: list[AgentProfile] = []
    for value in values:
        if isinstance(value, type):
            continue
        if isinstance(value, AgentProfile):
            if value.name is not None:
                explicit.append(value)
            continue
        entry = adapters.get(type(value).__module__.partition(".")[0])
        if entry is not None and getattr(value, "name", None) is not None:
            adapt: Callable[[Any], AgentProfile | None] = entry.load()
            profile = adapt(value)
            if profile is not None:
                adapted.append(profile)
    names = {p.name for p in explicit}
    return explicit + [p for p in adapted if p.name not in names]
