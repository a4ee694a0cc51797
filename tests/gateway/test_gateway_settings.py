"""The gateway's keys resolve like every setting: explicit argument > CONVOQ_* > default
(none: every request refused); bad keys are a ConfigurationError naming the variable."""

from __future__ import annotations

import json

import pytest

from convoq.errors import ConfigurationError
from convoq.gateway import create_app
from convoq.gateway.problems import GatewayError
from convoq.settings import GatewayKey

ENV_KEY = "from-the-environment-0123"
ARG_KEY = "from-the-argument-0123456"


def _env(monkeypatch: pytest.MonkeyPatch, *specs: dict[str, object]) -> None:
    monkeypatch.setenv("CONVOQ_GATEWAY_API_KEYS", json.dumps(list(specs)))


def _knows(app: object, key: str) -> bool:
    try:
        app.state.keys.authenticate(f"Bearer {key}")  # type: ignore[attr-defined]
    except GatewayError:
        return False
    return True


def test_explicit_keys_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, {"key": ENV_KEY, "scopes": ["read"]})
    from_env = create_app()
    assert _knows(from_env, ENV_KEY) and not _knows(from_env, ARG_KEY)
    explicit = create_app(gateway_api_keys=[GatewayKey(key=ARG_KEY, scopes=("admin",))])
    assert _knows(explicit, ARG_KEY) and not _knows(explicit, ENV_KEY)


def test_no_keys_by_default_refuses_everyone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONVOQ_GATEWAY_API_KEYS", raising=False)
    app = create_app()
    assert len(app.state.keys) == 0 and not _knows(app, ENV_KEY)


@pytest.mark.parametrize(
    "spec",
    [
        {"key": "short", "scopes": ["read"]},  # under 16 characters
        {"key": ENV_KEY, "scopes": ["root"]},  # no such scope
        {"key": ENV_KEY, "scopes": []},
        {"key": ENV_KEY, "scopes": ["read"], "tenant": "x"},  # unknown field
    ],
)
def test_bad_keys_are_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, spec: dict[str, object]
) -> None:
    _env(monkeypatch, spec)
    with pytest.raises(ConfigurationError, match="CONVOQ_GATEWAY_API_KEYS"):
        create_app()
