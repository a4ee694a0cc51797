"""``ConvoqSettings``: every ``CONVOQ_*`` environment variable, read only at the edges
(the CLI, worker start-up, the embedded default). Library classes take explicit arguments.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from convoq.limits import DEFAULT_MAX_ATTACHMENT_BYTES, DEFAULT_MAX_TURN_BYTES
from convoq.redis.embedded import DEFAULT_HOME


class ConvoqSettings(BaseSettings):
    """Configuration from the environment (prefix ``CONVOQ_``) or keyword arguments."""

    model_config = SettingsConfigDict(env_prefix="CONVOQ_", extra="ignore")

    redis_url: str | None = Field(
        default=None,
        description="Redis for memory and the turn protocol (redis://, rediss://, unix://)."
        " Unset: an embedded redis-server under `home`.",
    )
    broker_url: str | None = Field(
        default=None, description="Celery broker; defaults to redis_url (amqp:// works too)."
    )
    prefix: str = Field(default="convoq", description="Prefix of every Redis key.")
    home: Path = Field(default=DEFAULT_HOME, description="Where the embedded Redis lives.")
    partitions: int = Field(default=16, ge=1, le=1024, description="Queues convoq.p0..p{N-1}.")
    agents: str | None = Field(default=None, description="Module with the agent profiles.")
    concurrency: int = Field(default=32, ge=1, description="Turns in flight per worker process.")
    lease_ms: int = Field(
        default=10_000, ge=500, description="Lease TTL; renewed while a turn runs."
    )
    sweep_interval_s: float = Field(default=5.0, gt=0, description="Sweeper period.")
    max_attempts: int = Field(default=5, ge=1, description="Runs of a turn before it fails.")
    approval_ttl_s: int = Field(default=86_400, ge=1, description="Parked approvals expire.")
    turn_ttl_s: int = Field(default=7 * 86_400, ge=60, description="Finished turn records expire.")
    max_attachment_bytes: int = Field(default=DEFAULT_MAX_ATTACHMENT_BYTES, ge=1)
    max_turn_bytes: int = Field(default=DEFAULT_MAX_TURN_BYTES, ge=1)
    webhook_secret: str | None = Field(default=None, description="HMAC key for callbacks.")
    webhook_max_retries: int = Field(default=8, ge=0)
    webhook_retry_base_s: float = Field(
        default=2.0, gt=0, description="First webhook retry delay; doubles per retry."
    )
    webhook_timeout_s: float = Field(default=10.0, gt=0, description="Per webhook POST.")
    visibility_timeout_s: int = Field(
        default=3600,
        ge=60,
        description="Redis broker: an unacked task is redelivered after this long. Crash"
        " recovery does not wait for it (the sweeper re-kicks after lease_ms).",
    )
    task_events: bool = Field(
        default=True,
        description="Workers send Celery task events (Flower needs them; off saves ~0.3 ms/turn).",
    )
    flower_port: int = Field(default=5555, ge=1, le=65535)
    flower_basic_auth: str | None = Field(
        default=None,
        description="user:password for `convoq flower` (comma separated for several users).",
    )

    @property
    def effective_broker_url(self) -> str | None:
        return self.broker_url or self.redis_url
