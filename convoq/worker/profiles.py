"""Agent profiles: the named :class:`convoq.Agent` objects a worker can run.

A profile module is any importable module (``CONVOQ_AGENTS=myapp.agents`` or
``convoq worker --agents myapp.agents``); every ``Agent`` instance with a ``name`` among its
attributes is a profile. Several modules may be given, separated by commas. As with
``celery -A``, the working directory is on the import path: ``myapp/`` beside where the
worker starts imports without setting ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable, Iterator, Mapping

from convoq.agent import Agent
from convoq.errors import ConfigurationError, UnknownAgentError
from convoq.window import STORE_CHOOSES, AgentWindows


class Profiles(Mapping[str, Agent]):
    """The profiles of a worker, by name."""

    def __init__(self, agents: Iterable[Agent]) -> None:
        self._agents: dict[str, Agent] = {}
        for agent in agents:
            if agent.name is None:
                raise ConfigurationError("an agent profile needs a name: Agent(..., name='...')")
            other = self._agents.get(agent.name)
            if other is not None and other is not agent:
                raise ConfigurationError(f"two agent profiles are named {agent.name!r}")
            self._agents[agent.name] = agent

    def __getitem__(self, name: str) -> Agent:
        return self._agents[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._agents)

    def __len__(self) -> int:
        return len(self._agents)

    def get_profile(self, name: str) -> Agent:
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
        """The history window each profile's turns are handed out with, decided here once:
        its ``keep_last_turns`` (0 = all), or, for a profile with a token budget or a
        compaction policy, :data:`~convoq.window.STORE_CHOOSES` (the store chooses its
        window from the counts and summary stored with the turns). A turn for an agent
        this worker does not know fails, so it brings one turn only."""
        return AgentWindows(
            {name: handed_window(agent) for name, agent in self._agents.items()},
            default=STORE_CHOOSES,
        )


def handed_window(agent: Agent) -> int:
    """The window ``agent``'s turns are handed out with (see :meth:`Profiles.windows`)."""
    if agent.max_history_tokens is not None or agent.compaction is not None:
        return STORE_CHOOSES
    return agent.keep_last_turns


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
    found: list[Agent] = []
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise ConfigurationError(
                f"cannot import agent module {name!r}: {exc}; check CONVOQ_AGENTS/--agents"
                " and that the module is on the Python path",
                module=name,
            ) from exc
        found.extend(
            v for v in vars(module).values() if isinstance(v, Agent) and v.name is not None
        )
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
