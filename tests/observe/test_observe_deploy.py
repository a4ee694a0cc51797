"""The monitoring files match the code: the dashboard graphs metrics convoq defines, and
Prometheus scrapes the port the workers are configured to serve."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import Counter, Gauge, Histogram

from convoq.observe import metrics

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _exposed_names() -> set[str]:
    names: set[str] = set()
    for collector in vars(metrics).values():
        if isinstance(collector, Counter):
            names.add(collector._name + "_total")
        elif isinstance(collector, Histogram):
            names.update(collector._name + suffix for suffix in ("_bucket", "_count", "_sum"))
        elif isinstance(collector, Gauge):
            names.add(collector._name)
    return names


def test_the_dashboard_graphs_only_metrics_convoq_exposes_and_every_one_of_them() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "convoq.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {name for expr in exprs for name in re.findall(r"\bconvoq_\w+", expr)}
    exposed = _exposed_names()
    assert used - exposed == set()
    # Every metric has a panel (a histogram through one of its series).
    families = {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in exposed}
    shown = {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in used}
    assert families - shown == set()


def test_prometheus_scrapes_the_port_workers_serve_metrics_on() -> None:
    scrape = (DEPLOY / "prometheus" / "prometheus.yml").read_text()
    (port,) = re.findall(r"names: \[worker\]\s+type: A\s+port: (\d+)", scrape)
    compose = (DEPLOY / "docker-compose.yml").read_text()
    assert f'CONVOQ_METRICS_PORT: "{port}"' in compose
    worker = (DEPLOY / "k8s" / "worker.yaml").read_text()
    assert f"containerPort: {port}" in worker and f'value: "{port}"' in worker


def test_the_gateway_metrics_key_of_prometheus_is_a_metrics_key_in_kubernetes() -> None:
    config = (DEPLOY / "k8s" / "config.yaml").read_text()
    monitoring = (DEPLOY / "k8s" / "monitoring.yaml").read_text()
    (token,) = re.findall(r"token: (\S+)", monitoring)
    (keys,) = re.findall(r"CONVOQ_GATEWAY_API_KEYS: '(.*)'", config)
    assert {"key": token, "scopes": ["metrics"], "name": "prometheus"} in json.loads(keys)
    assert (DEPLOY / "prometheus" / "gateway-metrics-key").read_text().strip() == token


def test_deployments_scraped_from_another_host_open_the_metrics_port_beyond_loopback() -> None:
    # Workers bind metrics to loopback unless CONVOQ_METRICS_HOST is set (the endpoint has
    # no auth); Prometheus scrapes the compose and Kubernetes workers from elsewhere.
    compose = (DEPLOY / "docker-compose.yml").read_text()
    assert 'CONVOQ_METRICS_HOST: "0.0.0.0"' in compose
    worker = (DEPLOY / "k8s" / "worker.yaml").read_text()
    assert '{name: CONVOQ_METRICS_HOST, value: "0.0.0.0"}' in worker
    # Published nowhere: no host port for 9464 in compose.
    assert not re.search(r"^\s*-\s*\"?\d*:?9464", compose, re.MULTILINE)
