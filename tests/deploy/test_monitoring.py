"""The monitoring component: ServiceMonitor and PrometheusRule shapes (no CRD schemas offline),
alert logic (promtool, when installed), and every metric name in the alerts and the Grafana
dashboard checked against a live /metrics scrape of the dev stack."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from harness.tools import require
from tests.deploy.support import DASHBOARD, MONITORING, dashboard_expressions, metric_names, objects, one, render

HERE = Path(__file__).parent
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
# Prometheus' own series for a target; nothing else may be referenced that watchcache does not export.
PROMETHEUS_SERIES = {"up"}
# Exported only by a group of workers (the dev stack runs one): test_dashboard_live.py checks them
# against a real 2-worker proxy.
WORKER_GROUP_SERIES = {"watchcache_worker_restarts_total", "watchcache_follower_resyncs_total"}


def _rules() -> dict[str, Any]:
    return one("production", "PrometheusRule", "watchcache")


def _expressions() -> list[tuple[str, str]]:
    found = [(f"alert {r['alert']}", r["expr"]) for g in _rules()["spec"]["groups"] for r in g["rules"]]
    dashboard = json.loads(DASHBOARD.read_text())
    found += dashboard_expressions(dashboard)
    return found


# --- the component --------------------------------------------------------------------------


def test_monitoring_is_a_component() -> None:
    kustomization = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1alpha1"
    assert kustomization["kind"] == "Component"


def test_service_monitor_scrapes_the_service_metrics_port() -> None:
    monitor = one("production", "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(monitor["spec"]) <= {"selector", "endpoints", "namespaceSelector", "jobLabel", "targetLabels"}
    service = one("production", "Service")
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items(), "the ServiceMonitor does not select the Service"
    port_names = {p["name"] for p in service["spec"]["ports"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in port_names and endpoint["path"] == "/metrics"
    for key in ("interval", "scrapeTimeout"):
        assert DURATION.match(endpoint[key]), endpoint
    # HTTPS, verifying the serving certificate with its CA, and a token allowed to read /metrics.
    assert endpoint["scheme"] == "https"
    tls = endpoint["tlsConfig"]
    assert tls["serverName"] == "watchcache.watchcache.svc"
    assert tls["ca"] == {"secret": {"name": "watchcache-serving-cert", "key": "ca.crt"}}
    assert not tls.get("insecureSkipVerify")
    certificate = one("production", "Certificate", "watchcache-serving-cert")
    assert certificate["spec"]["secretName"] == "watchcache-serving-cert"
    assert tls["serverName"] in certificate["spec"]["dnsNames"]
    # The job label is the Service name: what every expression selects.
    assert "jobLabel" not in monitor["spec"] and service["metadata"]["name"] == "watchcache"
    for where, expr in _expressions():
        if "up{" in expr or "apiserver_" in expr or "watchcache_" in expr:
            assert 'job="watchcache"' in expr, f'{where}: select job="watchcache"'


def test_the_scrape_token_may_get_metrics_and_nothing_else() -> None:
    """watchcache authorizes /metrics with a SubjectAccessReview (nonResourceAttributes get /metrics)."""
    (endpoint,) = one("production", "ServiceMonitor")["spec"]["endpoints"]
    auth = endpoint["authorization"]
    assert auth["type"] == "Bearer" and auth["credentials"]["key"] == "token"
    secret = one("production", "Secret", auth["credentials"]["name"])
    assert secret["type"] == "kubernetes.io/service-account-token"
    account = secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
    assert one("production", "ServiceAccount", account)["automountServiceAccountToken"] is False
    bindings = [b for b in objects("production", "ClusterRoleBinding")
                if {"kind": "ServiceAccount", "name": account, "namespace": "watchcache"} in b["subjects"]]  # fmt: skip
    (binding,) = bindings
    role = one("production", "ClusterRole", binding["roleRef"]["name"])
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]


def test_prometheus_may_scrape_through_the_network_policy() -> None:
    policy = one("production", "NetworkPolicy", "watchcache-prometheus")
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "https", "protocol": "TCP"}]
    assert rule["from"][0]["namespaceSelector"] and rule["from"][0]["podSelector"]


def test_prometheus_rule_shape() -> None:
    rule = _rules()
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(rule) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(rule["spec"]) == {"groups"}
    groups = rule["spec"]["groups"]
    assert len({g["name"] for g in groups}) == len(groups), "group names must be unique"
    alerts = []
    for group in groups:
        assert set(group) <= {"name", "interval", "rules", "limit", "partial_response_strategy", "query_offset"}
        assert group["name"] and group["rules"]
        for r in group["rules"]:
            assert set(r) == {"alert", "expr", "for", "labels", "annotations"}, r
            assert re.fullmatch(r"[A-Z][A-Za-z0-9]+", r["alert"]), r["alert"]
            assert isinstance(r["expr"], str) and r["expr"].strip()
            assert DURATION.match(r["for"]), r["for"]
            assert r["labels"]["severity"] in {"critical", "warning", "info"}
            assert r["annotations"]["summary"] and r["annotations"]["description"]
            alerts.append(r["alert"])
    assert len(set(alerts)) == len(alerts)
    # The alerts the deployment promises (deploy/README.md).
    expected = {
        "WatchcacheAllReplicasDown",
        "WatchcacheReplicaDown",
        "WatchcacheCacheNotSynced",
        "WatchcacheResourceVersionStalled",
        "WatchcacheReplicaLagging",
        "WatchcachePassthroughSpike",
        "WatchcacheConsistentReadFallbacks",
        "WatchcacheUpstreamRefusesWatchcache",
        "WatchcacheUpstreamFailing",
        "WatchcacheServerErrors",
        "WatchcacheRejectingRequests",
        "WatchcacheFlowControlRejecting",
        "WatchcacheWorkerRestarting",
        "WatchcacheRelisting",
        "WatchcacheSlowWatchersExpired",
    }
    assert set(alerts) == expected


def test_dashboard_is_a_grafana_dashboard_in_a_labelled_configmap() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["uid"] and dashboard["schemaVersion"] >= 30
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 10
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    for panel in panels:
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
    (configmap,) = [o for o in render("production") if o["kind"] == "ConfigMap"]
    assert configmap["metadata"]["name"] == "watchcache-dashboard"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["watchcache.json"]) == dashboard


# --- metric names ------------------------------------------------------------------------------


def test_metric_name_extraction() -> None:
    assert metric_names('sum by (pod) (rate(a_total{job="x", reason!~"w|n"}[5m])) / on (pod) group_left () b') == {
        "a_total",
        "b",
    }
    assert metric_names('absent(up{job="x"} == 1) or vector(0) and c offset 1h > bool 0.5') == {"up", "c"}
    assert metric_names('label_values(d{namespace="$namespace"}, pod)') == {"d"}
    assert metric_names('e{pod=~"$pod"}[$__rate_interval]') == {"e"}
    assert metric_names("max without (instance) (f) - min(f) > 1e3") == {"f"}


def test_every_expression_uses_only_exported_metrics(dev_stack: Any) -> None:
    from tests.deploy.support import exposed_series_names

    exposed = exposed_series_names(dev_stack.metrics) | PROMETHEUS_SERIES | WORKER_GROUP_SERIES
    # The counters are stored with _total: a bare family name would select nothing.
    assert "apiserver_watch_cache_events_received_total" in exposed
    assert "apiserver_watch_cache_events_received" not in exposed
    assert "watchcache_passthrough_requests_total" in exposed
    assert "apiserver_watch_cache_consistent_read_total" in exposed
    used: set[str] = set()
    for where, expr in _expressions():
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        missing = names - exposed
        assert not missing, f"{where}: {sorted(missing)} not exported by watchcache (/metrics)"
        used |= names
    assert used >= {
        "up",
        "apiserver_watch_cache_resource_version",
        "watchcache_passthrough_requests_total",
        "apiserver_watch_cache_consistent_read_total",
    }


# --- promtool ----------------------------------------------------------------------------------


def _promtool() -> str:
    return require("promtool", "apt-get install prometheus")


def _write_rules(path: Path, *, annotations: bool) -> None:
    groups = _rules()["spec"]["groups"]
    if not annotations:  # promtool's unit tests compare annotations too; they test the expressions
        groups = [
            {**g, "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in g["rules"]]} for g in groups
        ]
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))


def test_promtool_check_rules(tmp_path: Path) -> None:
    exe = _promtool()
    rules = tmp_path / "watchcache-rules.yaml"
    _write_rules(rules, annotations=True)
    # The dashboard's queries too, as recording rules (Grafana variables substituted).
    substitutions = {"$__rate_interval": "5m", "$namespace": "watchcache", "$pod": ".*"}
    records = []
    for i, (_, expr) in enumerate(dashboard_expressions(json.loads(DASHBOARD.read_text()))):
        if expr.startswith("label_values("):
            expr = expr[len("label_values(") :].rsplit(",", 1)[0]
        for variable, value in substitutions.items():
            expr = expr.replace(variable, value)
        records.append({"record": f"dashboard:query_{i}", "expr": expr})
    dashboard_rules = tmp_path / "dashboard-queries.yaml"
    dashboard_rules.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    out = subprocess.run([exe, "check", "rules", str(rules), str(dashboard_rules)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_alert_unit_tests(tmp_path: Path) -> None:
    exe = _promtool()
    _write_rules(tmp_path / "rules.yaml", annotations=False)
    shutil.copy(HERE / "alerts_test.yaml", tmp_path / "alerts_test.yaml")
    out = subprocess.run(
        [exe, "test", "rules", "alerts_test.yaml"], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
