"""How a client comes to its settings: the arguments it was given, resolved as every
entry point resolves them (:meth:`ConvoqSettings.resolve`: argument, else ``CONVOQ_*``,
else the default), or settings already resolved (the CLI and the gateway pass theirs)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from convoq.errors import ConfigurationError
from convoq.settings import ConvoqSettings


def client_settings(given: ConvoqSettings | None, explicit: dict[str, Any]) -> ConvoqSettings:
    """``given``, or the settings ``explicit`` (argument name -> value, None: not given)
    resolve to.

    Raises:
        ConfigurationError: both were given, or a setting is invalid.
    """
    partitions = explicit.get("partitions")
    # Checked here: a bad count would only fail when routing, after the turn is stored.
    if partitions is not None and (
        isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1
    ):
        raise ConfigurationError(
            f"partitions must be an int >= 1 matching the workers' CONVOQ_PARTITIONS,"
            f" not {partitions!r}"
        )
    networks = explicit.get("callback_allowed_networks")
    explicit = {**explicit, "callback_allowed_networks": _networks_setting(networks)}
    if given is None:
        return ConvoqSettings.resolve(**explicit)
    if named := sorted(name for name, value in explicit.items() if value is not None):
        raise ConfigurationError(
            f"pass either settings= or {named}, not both: settings are already resolved"
        )
    return given


def _networks_setting(value: str | Collection[str] | None) -> str | None:
    return value if value is None or isinstance(value, str) else ",".join(value)
