"""convoq inside other agent frameworks, each behind its own extra.

* :mod:`convoq.integrations.openai_agents` (``pip install 'convoq[openai-agents]'``):
  convoq memory as the OpenAI Agents SDK's ``Session``.
* :mod:`convoq.integrations.langchain` (``pip install 'convoq[langchain]'``): convoq
  memory as a LangChain chat message history.

The core never imports this package. Importing a module here without its framework
installed raises :class:`MissingExtraError`, which names the extra to install.
"""

from __future__ import annotations

from convoq.errors import ConfigurationError

__all__ = ["MissingExtraError", "missing_extra"]


class MissingExtraError(ConfigurationError, ImportError):
    """A framework integration was imported without its extra installed."""


def missing_extra(module: str, *, extra: str, integration: str) -> MissingExtraError:
    """The error for ``integration`` imported without ``module`` (from the extra ``extra``)."""
    return MissingExtraError(
        f"{integration} needs the {module!r} package, which convoq's {extra!r} extra"
        f" installs: pip install 'convoq[{extra}]'",
        extra=extra,
        missing=module,
    )
