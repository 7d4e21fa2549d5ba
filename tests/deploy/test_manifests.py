"""The Kubernetes manifests under deploy/: they render, validate against the Kubernetes 1.32
schemas offline, use only flags the CLI has, and keep the properties the deployment relies on."""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest
import yaml

from tests.deploy.support import (
    DEPLOY,
    KUBERNETES_VERSION,
    REPO,
    TARGETS,
    argv,
    cli_flags,
    dev_stack_block,
    flag_value,
    iter_containers,
    objects,
    one,
    pod_containers,
    render,
)
from watchcache.flags import build_parser
from watchcache.server.context import ServeConfig

ALL = list(TARGETS)
OVERLAYS = ["dev", "production"]
CRD_KINDS = {"ServiceMonitor", "PrometheusRule", "Certificate", "Issuer"}
MONITORING_KINDS = {"ServiceMonitor", "PrometheusRule"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}


# --- rendering and schemas ---------------------------------------------------------------------


@pytest.mark.parametrize("target", ALL)
def test_renders(target: str) -> None:
    kinds = {o["kind"] for o in render(target)}
    assert {"Namespace", "ServiceAccount", "Deployment", "Service", "NetworkPolicy"} <= kinds
    # A single replica gets no disruption budget: minAvailable 1 would block node drains.
    assert ("PodDisruptionBudget" in kinds) == (one(target, "Deployment")["spec"]["replicas"] > 1)
    for obj in render(target):
        assert obj["apiVersion"] and obj["metadata"]["name"], obj


@pytest.mark.parametrize("target", ALL)
def test_objects_validate_against_kubernetes_schemas(target: str) -> None:
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate (dev extra) is not installed"
    )
    checked = 0
    for obj in render(target):
        if obj["kind"] in CRD_KINDS:
            continue  # no schema shipped; test_monitoring.py checks their shape
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{target}: {obj['kind']}/{obj['metadata']['name']} is invalid: {e}")
        checked += 1
    assert checked >= 5


@pytest.mark.parametrize("target", ALL)
def test_names_and_namespaces_are_unique_and_set(target: str) -> None:
    seen = set()
    for obj in render(target):
        key = (obj["apiVersion"].split("/")[0], obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])
        assert key not in seen, f"{target}: duplicate {key}"
        seen.add(key)
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in obj["metadata"], obj["metadata"]
        else:
            assert obj["metadata"].get("namespace") == "watchcache", f"{target}: {obj['kind']} not in namespace"


# --- the CLI -----------------------------------------------------------------------------------


def _check_cli_args(where: str, words: list[str]) -> None:
    assert words[0] == "watchcache", f"{where}: runs {words[0]!r}, not watchcache"
    subcommand, args = words[1], words[2:]
    assert subcommand in {"serve", "sim"}, f"{where}: unexpected subcommand {subcommand!r}"
    known = cli_flags(subcommand)
    used = {a.split("=", 1)[0] for a in args if a.startswith("--")}
    unknown = used - known
    assert not unknown, f"{where}: flags not in `watchcache {subcommand} --help`: {sorted(unknown)}"
    try:  # and the values parse (types, choices)
        build_parser().parse_args(words[1:])
    except SystemExit:
        pytest.fail(f"{where}: `{' '.join(words)}` does not parse")


def test_every_container_flag_exists_in_the_cli() -> None:
    containers = list(iter_containers(ALL))
    assert len(containers) >= 4
    for target, obj, container in containers:
        _check_cli_args(f"{target} {obj['kind']} container {container['name']}", argv(container))


def test_deploy_readme_commands_use_existing_flags() -> None:
    text = (DEPLOY / "README.md").read_text()
    block = dev_stack_block(text)
    assert block, "deploy/README.md has no <!-- dev-stack --> block"
    for words in block:
        _check_cli_args("deploy/README.md dev-stack block", words)
    # `docker run ... IMAGE serve ...` lines, and container args given as YAML (the two-tier edge).
    runs = re.findall(r"^docker run .*? watchcache:\S+ (.*)$", text, re.MULTILINE)
    edges = [yaml.safe_load(b)["args"] for b in re.findall(r"```yaml\n(args:.*?)```", text, re.DOTALL)]
    assert runs and edges
    for args in [shlex.split(r) for r in runs] + edges:
        _check_cli_args("deploy/README.md", ["watchcache", *map(str, args)])


# --- the dev overlay ---------------------------------------------------------------------------


def _dev_commands() -> list[list[str]]:
    deployment = one("dev", "Deployment")
    return [argv(c) for c in deployment["spec"]["template"]["spec"]["containers"]]


def test_dev_overlay_runs_the_sim_and_the_proxy_in_one_pod() -> None:
    deployment = one("dev", "Deployment")
    assert deployment["spec"]["replicas"] == 1
    commands = sorted(_dev_commands())
    assert commands == sorted(
        [
            shlex.split("watchcache sim --listen 127.0.0.1:8081 --objects 1000 --namespaces 10 --churn 5"),
            shlex.split("watchcache serve --listen 0.0.0.0:8080 --upstream http://127.0.0.1:8081 --workers 1"),
        ]
    )
    # The upstream is the sim, not the apiserver: no RBAC, no token.
    kinds = {o["kind"] for o in render("dev")}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_dev_commands_match_deploy_readme() -> None:
    block = dev_stack_block((DEPLOY / "README.md").read_text())
    assert block is not None, "deploy/README.md lacks the <!-- dev-stack --> block"
    assert sorted(block) == sorted(_dev_commands())


def test_dev_commands_match_top_level_readme_if_it_has_the_block() -> None:
    readme = REPO / "README.md"
    block = dev_stack_block(readme.read_text()) if readme.exists() else None
    if block is None:
        pytest.skip("README.md has no <!-- dev-stack --> block yet")
    assert sorted(block) == sorted(_dev_commands()), "README.md's dev-stack block differs from the dev overlay"


def test_dev_stack_runs_from_the_manifest_arguments(dev_stack: Any) -> None:
    # Every path a probe of any overlay uses answers 200 once ready.
    paths = set()
    for _, _, container in iter_containers(ALL):
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in container:
                paths.add(container[probe]["httpGet"]["path"])
    assert paths == {"/readyz", "/livez"}
    for path in [*paths, "/healthz", "/metrics"]:
        assert dev_stack.status[path] == 200, path
    assert dev_stack.ready_after < 20
    # SIGTERM: watches end and the processes exit 0 (within the grace period: stop() waits 15 s).
    assert dev_stack.exit_codes == {"serve": 0, "sim": 0}


# --- base / production properties --------------------------------------------------------------


@pytest.mark.parametrize("target", ["base", "production"])
def test_proxy_container(target: str) -> None:
    deployment = one(target, "Deployment")
    (container,) = [c for c in pod_containers(deployment) if c["name"] == "watchcache"]
    words = argv(container)
    assert words[:3] == ["watchcache", "serve", "--in-cluster"]
    assert flag_value(words, "--listen") == "0.0.0.0:8443"
    # The worker count follows the container's CPU limit (watchcache reads it from its cgroup).
    assert flag_value(words, "--workers") is None
    assert container["resources"]["limits"]["cpu"]
    # Probes and the Service reach the port --listen binds, over HTTPS.
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"https": 8443}
    (service_port,) = one(target, "Service")["spec"]["ports"]
    assert (service_port["name"], service_port["port"], service_port["targetPort"]) == ("https", 443, "https")
    # Probes: liveness /livez, readiness /readyz, and a startup probe on /readyz that allows
    # an initial sync of a large cluster (about 10 minutes).
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "https", "scheme": "HTTPS"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    startup = container["startupProbe"]
    assert startup["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    assert startup["failureThreshold"] * startup["periodSeconds"] >= 600
    spec = deployment["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] >= 30
    assert container["resources"]["requests"] and container["resources"]["limits"]


@pytest.mark.parametrize("target", ["base", "production"])
def test_the_proxy_serves_tls_from_the_serving_cert_secret(target: str) -> None:
    """Clients pass credentials through it: kubectl and client-go send none to an http:// server."""
    spec = one(target, "Deployment")["spec"]["template"]["spec"]
    (container,) = [c for c in spec["containers"] if c["name"] == "watchcache"]
    words = argv(container)
    cert, key = flag_value(words, "--tls-cert-file"), flag_value(words, "--tls-private-key-file")
    assert (cert, key) == ("/etc/watchcache/tls/tls.crt", "/etc/watchcache/tls/tls.key")
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/watchcache/tls"]
    assert mount["readOnly"] is True
    volume = {v["name"]: v for v in spec["volumes"]}[mount["name"]]
    assert volume["secret"]["secretName"] == "watchcache-serving-cert" and "items" not in volume["secret"]


def test_production_gets_its_serving_certificate_from_cert_manager() -> None:
    certificate = one("production", "Certificate", "watchcache-serving-cert")
    assert certificate["spec"]["secretName"] == "watchcache-serving-cert"
    assert "watchcache.watchcache.svc" in certificate["spec"]["dnsNames"]
    issuer = certificate["spec"]["issuerRef"]
    assert one("production", "Issuer", issuer["name"])["spec"]["ca"]  # a CA issuer: the Secret carries ca.crt
    assert not objects("base", "Certificate"), "the base leaves the certificate's origin to the overlay"


@pytest.mark.parametrize("target", ALL)
def test_plain_http_only_in_front_of_a_plain_http_upstream(target: str) -> None:
    """A proxy without TLS is acceptable only where nothing needs credentials (the dev overlay's sim)."""
    for _, _, container in iter_containers([target]):
        words = argv(container)
        if words[1] != "serve" or flag_value(words, "--tls-cert-file"):
            continue
        assert (flag_value(words, "--upstream") or "").startswith("http://"), f"{target}: plain HTTP proxy"
        assert "--in-cluster" not in words and "--kubeconfig" not in words


def test_the_dev_overlay_says_why_it_serves_plain_http() -> None:
    text = (DEPLOY / "kubernetes" / "overlays" / "dev" / "kustomization.yaml").read_text()
    assert "PLAIN HTTP" in text and "send no bearer token" in text and "TLS" in text


@pytest.mark.parametrize("target", ["base", "production"])
def test_continue_token_key_is_one_secret_mounted_where_the_flag_points(target: str) -> None:
    deployment = one(target, "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    (container,) = [c for c in spec["containers"] if c["name"] == "watchcache"]
    key_file = flag_value(argv(container), "--continue-token-key-file")
    assert key_file == "/etc/watchcache/continue-token/key"
    (secret,) = [s for s in objects(target, "Secret") if s["metadata"]["name"].startswith("watchcache-continue-token")]
    assert secret["metadata"]["name"].startswith("watchcache-continue-token-")  # generated, hash-suffixed
    volumes = {v["name"]: v for v in spec["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if key_file.startswith(m["mountPath"] + "/")]
    assert mount["readOnly"] is True
    volume = volumes[mount["name"]]["secret"]
    assert volume["secretName"] == secret["metadata"]["name"]
    item = key_file.removeprefix(mount["mountPath"] + "/")
    assert [i["path"] for i in volume["items"]] == [item]
    key = (DEPLOY / "kubernetes" / "base" / "continue-token.key").read_bytes().strip()
    assert len(key) >= 16, "watchcache rejects continue-token keys shorter than 16 bytes"


@pytest.mark.parametrize("target", ALL)
def test_pods_are_restricted(target: str) -> None:
    """Pod Security "restricted", read-only root filesystem with an emptyDir at /tmp."""
    namespace = one(target, "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for workload in objects(target, "Deployment"):
        spec = workload["spec"]["template"]["spec"]
        pod_sc = spec["securityContext"]
        assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] > 0
        assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
        tmp_volumes = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
        for container in pod_containers(workload):
            sc = container["securityContext"]
            where = f"{target} container {container['name']}"
            assert sc["runAsNonRoot"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert not sc.get("privileged"), where
            tmp = [m for m in container.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
            assert tmp and tmp[0]["name"] in tmp_volumes, f"{where}: no emptyDir at /tmp"
            assert container["resources"]["requests"] and container["resources"]["limits"], where
            assert ":" in container["image"] and not container["image"].endswith(":latest"), where


@pytest.mark.parametrize(("target", "replicas", "min_available"), [("base", 2, 1), ("production", 3, 2)])
def test_replicas_spread_and_disruption_budget(target: str, replicas: int, min_available: int) -> None:
    deployment = one(target, "Deployment")
    assert deployment["spec"]["replicas"] == replicas
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in spread} == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
    for constraint in spread:
        assert constraint["labelSelector"]["matchLabels"] == selector
    pdb = one(target, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == min_available
    assert pdb["spec"]["selector"]["matchLabels"] == selector
    assert one(target, "Service")["spec"]["selector"] == selector


def test_production_autoscales_on_cpu() -> None:
    hpa = one("production", "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "watchcache"}
    assert hpa["spec"]["minReplicas"] >= one("production", "PodDisruptionBudget")["spec"]["minAvailable"] + 1
    assert hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["type"] == "Utilization"
    # Utilisation is relative to the request: there must be one.
    (container,) = [c for c in pod_containers(one("production", "Deployment")) if c["name"] == "watchcache"]
    assert container["resources"]["requests"]["cpu"]
    base = next(c for c in pod_containers(one("base", "Deployment")) if c["name"] == "watchcache")
    assert container["resources"] != base["resources"], "production should size its pods"
    assert {o["kind"] for o in render("production")} >= MONITORING_KINDS, "the monitoring component is not enabled"


def _rbac_rules(target: str) -> dict[tuple[str, str], set[str]]:
    role = one(target, "ClusterRole", "watchcache")
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


@pytest.mark.parametrize("target", ["base", "production"])
def test_rbac_reads_every_kind_plus_delegated_auth_and_flow_control(target: str) -> None:
    # Every kind: any list-watchable kind is cached from its first read (docs/architecture.md).
    expected = {("*", "*"): {"get", "list", "watch"}}
    expected[("authentication.k8s.io", "tokenreviews")] = {"create"}
    expected[("authorization.k8s.io", "subjectaccessreviews")] = {"create"}
    for resource in ("flowschemas", "prioritylevelconfigurations"):  # API Priority and Fairness's configuration
        expected[("flowcontrol.apiserver.k8s.io", resource)] = {"list", "watch"}
    assert _rbac_rules(target) == expected
    binding = one(target, "ClusterRoleBinding", "watchcache")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "watchcache"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "watchcache", "namespace": "watchcache"}]
    deployment = one(target, "Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "watchcache"
    assert one(target, "ServiceAccount", "watchcache")["automountServiceAccountToken"] is not False


@pytest.mark.parametrize("target", ALL)
def test_network_policy_admits_only_labelled_client_namespaces(target: str) -> None:
    policy = one(target, "NetworkPolicy", "watchcache-clients")
    selector = one(target, "Deployment")["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["podSelector"]["matchLabels"] == selector
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"watchcache-client": "true"}}}]
    assert rule["ports"] == [{"port": "http" if target == "dev" else "https", "protocol": "TCP"}]


def test_no_configmap_in_the_base() -> None:
    # Only the monitoring component has something real to put in one (the dashboard).
    assert not objects("base", "ConfigMap")


@pytest.mark.parametrize("target", ["base", "production"])
def test_a_rolling_update_waits_for_synced_pods_and_drains_within_the_grace_period(target: str) -> None:
    """Issue 20: a rollout is a non-event for clients. A new pod is Ready only once every cached
    resource has synced on every worker (``/readyz``, tests/e2e/test_shards.py), and counts as
    available only after ``minReadySeconds``; no ready pod is taken down first; an old pod keeps
    serving while its endpoint is removed (preStop), then drains within the grace period."""
    deployment = one(target, "Deployment")
    spec = deployment["spec"]
    assert spec["strategy"]["type"] == "RollingUpdate"
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert spec["strategy"]["rollingUpdate"]["maxSurge"] >= 1
    assert spec["minReadySeconds"] >= 5
    pod = spec["template"]["spec"]
    (container,) = [c for c in pod_containers(deployment) if c["name"] == "watchcache"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    pause = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pause >= 5
    # The drain after SIGTERM: the supervisor gives its workers max(10, fresh-wait + 5) s, then 5 s
    # more before SIGKILL (watchcache/cli.py, shard/supervisor.py).
    fresh_wait = float(flag_value(argv(container), "--fresh-wait") or ServeConfig().fresh_wait)
    drain = max(10.0, fresh_wait + 5.0) + 5.0
    assert pod["terminationGracePeriodSeconds"] >= pause + drain, (pause, drain)
