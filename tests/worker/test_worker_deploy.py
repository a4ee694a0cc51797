"""The deployment files only use settings that exist and the queue names workers use."""

from __future__ import annotations

import re
from pathlib import Path

from convoq.observe import metrics
from convoq.settings import ConvoqSettings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _texts() -> dict[str, str]:
    return {str(p.relative_to(DEPLOY)): p.read_text() for p in DEPLOY.rglob("*") if p.is_file()}


def test_every_convoq_variable_in_deploy_is_a_setting() -> None:
    fields = set(ConvoqSettings.model_fields)
    used = {
        (name, var)
        for name, text in _texts().items()
        for var in re.findall(r"\bCONVOQ_[A-Z_]+[A-Z]\b", text)
    }
    assert used, "the deploy files configure convoq through CONVOQ_* variables"
    unknown = sorted((n, v) for n, v in used if v.removeprefix("CONVOQ_").lower() not in fields)
    assert unknown == []


def test_keda_reads_a_metric_the_workers_expose_and_prometheus_scrapes() -> None:
    keda = (DEPLOY / "k8s" / "keda.yaml").read_text()
    (query,) = re.findall(r"query: (.+)", keda)
    names = set(re.findall(r"\bconvoq_\w+", query))
    assert names == {metrics.INBOX_DEPTH._name}
    assert "partition" in metrics.INBOX_DEPTH._labelnames
    monitoring = (DEPLOY / "k8s" / "monitoring.yaml").read_text()
    assert "matchLabels: {app: convoq-worker}" in monitoring


def test_redis_runs_with_aof_and_noeviction_everywhere() -> None:
    for name in ["docker-compose.yml", "k8s/redis.yaml"]:
        text = (DEPLOY / name).read_text()
        assert "appendonly" in text and "noeviction" in text, name


def test_the_gateway_is_deployed_with_probes_on_its_health_routes() -> None:
    compose = (DEPLOY / "docker-compose.yml").read_text()
    assert '"convoq", "gateway"' in compose and "/readyz" in compose
    k8s = (DEPLOY / "k8s" / "gateway.yaml").read_text()
    assert "path: /readyz" in k8s and "path: /healthz" in k8s
    assert "gateway" in (DEPLOY / "Dockerfile").read_text()
