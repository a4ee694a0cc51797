"""The Celery tasks: thin. Arguments are a conversation id and a turn id, never message
bytes (brokers and Flower show task arguments); each task hands them to the runtime.

- ``convoq.drain(cid)``: run the conversation's queued turns.
- ``convoq.resume(cid, tid)``: a parked turn's approvals are all in; run it (a drain).
- ``convoq.deliver_callback(cid, tid)``: POST the signed webhook, retried with backoff.
- ``convoq.sweep()``: one sweeper pass, for deployments that prefer celery beat.
- ``convoq.compact(cid, agent)``: summarise the conversation's oldest turns if the
  profile's compaction policy says so (never beside a turn of it).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from celery import Task

from convoq.observe import metrics
from convoq.queue import routing
from convoq.worker import _direct, webhooks

if TYPE_CHECKING:
    from convoq.worker.app import ConvoqCelery

log = logging.getLogger("convoq.worker")


def register_tasks(app: ConvoqCelery) -> None:
    """Register convoq's tasks on ``app``."""

    @app.task(name=routing.DRAIN_TASK, ignore_result=True)
    def drain(conversation_id: str) -> dict[str, int]:
        return _summary(app.runtime().drain(conversation_id))

    if _direct.enabled(app.convoq_settings.fast_paths):
        # A kick that finds a free slot skips Celery's request and pool (._direct).
        drain.Strategy = _direct.STRATEGY

    @app.task(name=routing.RESUME_TASK, ignore_result=True)
    def resume(conversation_id: str, turn_id: str) -> dict[str, int]:
        # Acquire hands out a parked head once all its decisions are in; it is a drain.
        log.info("resuming %s/%s", conversation_id, turn_id)
        return _summary(app.runtime().drain(conversation_id))

    @app.task(name=routing.DELIVER_CALLBACK_TASK, bind=True, ignore_result=True)
    def deliver_callback(self: Task[Any, Any], conversation_id: str, turn_id: str) -> str:
        runtime = app.runtime()
        attempt = runtime.deliver_callback(conversation_id, turn_id)
        metrics.WEBHOOKS.labels(attempt.outcome).inc()
        if attempt.outcome != "retry":
            log.info(
                "callback %s/%s %s (%s)", conversation_id, turn_id, attempt.outcome, attempt.detail
            )
            runtime.callback_ended(conversation_id, turn_id)
            return attempt.outcome
        settings = runtime.settings
        retries = int(self.request.retries or 0)
        if retries >= settings.webhook_max_retries:
            log.error(
                "callback %s/%s given up after %d retries: %s",
                conversation_id,
                turn_id,
                retries,
                attempt.detail,
            )
            metrics.WEBHOOKS.labels("given_up").inc()
            runtime.callback_ended(conversation_id, turn_id)
            return "given_up"
        delay = webhooks.backoff_s(retries, settings.webhook_retry_base_s)
        runtime.callback_ended(conversation_id, turn_id, retry_in_s=delay)
        log.warning(
            "callback %s/%s: %s; retry in %.1fs", conversation_id, turn_id, attempt.detail, delay
        )
        raise self.retry(countdown=delay, max_retries=settings.webhook_max_retries)

    @app.task(name=routing.COMPACT_TASK, ignore_result=True)
    def compact(conversation_id: str, agent: str) -> int | None:
        summary = app.runtime().compact(conversation_id, agent)
        return None if summary is None else summary.watermark

    @app.task(name=routing.SWEEP_TASK, ignore_result=True)
    def sweep() -> list[str]:
        return app.runtime().sweep_once()


def _summary(report: Any) -> dict[str, int]:
    return {
        "succeeded": len(report.succeeded),
        "failed": len(report.failed),
        "parked": len(report.parked),
        "abandoned": len(report.abandoned),
    }
