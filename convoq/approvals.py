"""Approval policies: which tool calls wait for a human, and what the model is told.

A rule is ``True``/``False`` or a function ``(ctx, arguments) -> bool`` (sync or async),
given per tool (``@tool(requires_approval=...)``) or per agent
(``Agent(approval_policy=...)``, over every tool; ``ctx.tool_name`` says which). A call
waits when either says so. A rule that raises, or answers anything but a bool, fails
closed: the call waits for a human, and the reason is logged, since running a tool
nobody could vet is the worse mistake.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

from convoq._sync import call_maybe_async
from convoq.context import RunContext
from convoq.errors import ConvoqError
from convoq.ids import is_label
from convoq.messages import Decision

log = logging.getLogger("convoq.approvals")

ApprovalPolicy = Callable[[RunContext[Any], dict[str, Any]], bool | Awaitable[bool]]
"""Decides per call: ``(ctx, arguments) -> bool``, sync or async."""

ApprovalRule = bool | ApprovalPolicy


def check_rule(rule: object, owner: str) -> ApprovalRule:
    """``rule`` as given when it is a bool or a function of two arguments; else ConvoqError."""
    if isinstance(rule, bool):
        return rule
    if not callable(rule):
        raise ConvoqError(
            f"{owner}: an approval rule is True, False or a function (ctx, arguments) -> bool,"
            f" not {type(rule).__name__}"
        )
    try:
        inspect.signature(rule).bind(None, {})
    except TypeError:
        raise ConvoqError(
            f"{owner}: an approval policy is called as policy(ctx, arguments); {rule!r}"
            " does not take those two arguments"
        ) from None
    except ValueError:  # no signature to inspect (some builtins): trust it
        pass
    return cast(ApprovalPolicy, rule)


async def rule_says(
    rule: ApprovalRule, ctx: RunContext[Any], arguments: dict[str, Any], owner: str
) -> bool:
    """Whether ``rule`` asks for approval of this call (failing closed, see the module)."""
    if isinstance(rule, bool):
        return rule
    try:
        answer = await call_maybe_async(rule, ctx, dict(arguments))
    except Exception as exc:
        log.warning("%s: approval policy raised %r; the call waits for approval", owner, exc)
        return True
    if not isinstance(answer, bool):
        log.warning(
            "%s: approval policy answered %r, not a bool; the call waits for approval",
            owner,
            answer,
        )
        return True
    return answer


MAX_DECIDER_CHARS = 200


MAX_REASON_CHARS = 2000


def check_decision_note(reason: object, by: object) -> tuple[str | None, str | None]:
    """Why and who of an approval decision: ``reason`` None or a str of at most
    MAX_REASON_CHARS; ``by`` None or a str of 1 to MAX_DECIDER_CHARS characters without
    control characters (it is shown on the inbox page and in the history)."""
    if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS):
        raise ConvoqError(
            f"reason must be a str of at most {MAX_REASON_CHARS} characters", field="reason"
        )
    if by is None:
        return reason, None
    if not is_label(by, MAX_DECIDER_CHARS):
        raise ConvoqError(
            f"by must name who decided: a str of 1 to {MAX_DECIDER_CHARS} characters"
            " without control characters",
            field="by",
        )
    return reason, by


def refused_result(decision: Decision) -> str:
    """The tool result the model reads for a call that was denied or whose approval
    expired: what happened, who decided and why."""
    who = f" by {decision.by}" if decision.by else ""
    why = f": {decision.reason}" if decision.reason else ""
    if decision.expired:
        return f"No one approved this tool call before its approval expired{why}. It did not run."
    return f"The user denied this tool call{who}{why}. It did not run; do not retry it."
