"""kube-apiserver's printers for the kinds the proxy caches, ported from ``printers.go``.

Each function takes the object as the cache holds it (the v1 JSON kube serves, decoded) and
returns its cells as ``printPod``, ``printNode``... return them from the internal type: the
internal conversions that matter are applied here (a pod's ``podIP`` before ``podIPs``; a nil
``replicas`` reads 0). Cells that depend on the request's time are ``Since`` holes (see
``row.py``). kube-apiserver prints every column, wide ones included (its TableConvertor sets
``Wide: true``); kubectl hides the priority-1 columns unless ``-o wide``.

The source of truth is the vendored Kubernetes v1.36 tree (pkg/printers/internalversion/printers.go);
the recorded Tables in tests/fixtures/tables/ and the reference tier check each printer
against kube-apiserver itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from watchcache.printers import columns
from watchcache.printers.duration import ZERO_TIME, parse_time
from watchcache.printers.row import Cell, FunctionPrinter, Since, Unprintable
from watchcache.selectors import SelectorError
from watchcache.selectors.labels import LabelRequirement, Operator

Obj = dict[str, Any]
Cells = tuple[list[Cell], list[dict[str, str]]]

NODE_ROLE_PREFIX = "node-role.kubernetes.io/"
NODE_LABEL_ROLE = "kubernetes.io/role"
NODE_UNREACHABLE_POD_REASON = "NodeLost"


# ------------------------------------------------------------------------------------ accessors


def _map(value: Any) -> dict[str, Any]:
    """A struct or map field: absent or null reads as empty (Go's zero value)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Unprintable(f"expected an object, got {type(value).__name__}")
    return value


def _list(value: Any) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise Unprintable(f"expected a list, got {type(value).__name__}")
    return value


def _str(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise Unprintable(f"expected a string, got {type(value).__name__}")
    return value


def _int(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise Unprintable(f"expected an integer, got {type(value).__name__}")
    return value


def _time(value: Any) -> int:
    """A ``metav1.Time`` (absent: the zero time)."""
    if value is None:
        return ZERO_TIME
    parsed = parse_time(value)
    if parsed is None:
        raise Unprintable(f"invalid time {value!r}")
    return parsed


def _name(obj: Obj) -> str:
    return _str(_map(obj.get("metadata")).get("name"))


def since(at: int, prefix: str = "", suffix: str = "") -> Cell:
    """``translateTimestampSince``: ``<unknown>`` for the zero time, else an age hole."""
    if at == ZERO_TIME:
        return "<unknown>"
    return Since(at, prefix, suffix)


def _age(obj: Obj) -> Cell:
    return since(_time(_map(obj.get("metadata")).get("creationTimestamp")))


# ------------------------------------------------------------------------ labels and selectors


def format_labels(labels: Any) -> str:
    """``labels.FormatLabels``: ``k=v`` sorted by key, or ``<none>``."""
    labels = _map(labels)
    text = ",".join(f"{k}={_str(labels[k])}" for k in sorted(labels))
    return text or "<none>"


_SELECTOR_OPS = {
    "In": Operator.IN,
    "NotIn": Operator.NOT_IN,
    "Exists": Operator.EXISTS,
    "DoesNotExist": Operator.DOES_NOT_EXIST,
}


def _requirement_string(key: str, op: Operator, values: list[str]) -> str:
    if op is Operator.EXISTS:
        return key
    if op is Operator.DOES_NOT_EXIST:
        return "!" + key
    joined = ",".join(sorted(values))
    if op is Operator.IN:
        return f"{key} in ({joined})"
    if op is Operator.NOT_IN:
        return f"{key} notin ({joined})"
    return f"{key}={joined}"


def selector_string(selector: Any) -> str | None:
    """``metav1.LabelSelectorAsSelector(selector).String()``; None where it returns an error."""
    if selector is None:
        return ""  # labels.Nothing()
    selector = _map(selector)
    match_labels = _map(selector.get("matchLabels"))
    expressions = _list(selector.get("matchExpressions"))
    if not match_labels and not expressions:
        return ""  # labels.Everything()
    requirements: list[tuple[str, str]] = []
    try:
        for key, value in match_labels.items():
            LabelRequirement(key, Operator.EQUALS, (_str(value),))
            requirements.append((key, _requirement_string(key, Operator.EQUALS, [_str(value)])))
        for expr in expressions:
            expr = _map(expr)
            op = _SELECTOR_OPS.get(_str(expr.get("operator")))
            if op is None:
                return None
            key = _str(expr.get("key"))
            values = [_str(v) for v in _list(expr.get("values"))]
            LabelRequirement(key, op, tuple(values))
            requirements.append((key, _requirement_string(key, op, values)))
    except SelectorError:
        return None
    # selector.Add sorts by key (an insertion sort for so few: stable)
    requirements.sort(key=lambda r: r[0])
    return ",".join(text for _, text in requirements)


def format_label_selector(selector: Any) -> str:
    """``metav1.FormatLabelSelector``."""
    text = selector_string(selector)
    if text is None:
        return "<error>"
    return text or "<none>"


def _container_cells(template: Any) -> list[Cell]:
    """``layoutContainerCells`` of a pod template's containers: names and images, comma-separated."""
    containers = [_map(c) for c in _list(_map(_map(template).get("spec")).get("containers"))]
    return [",".join(_str(c.get("name")) for c in containers), ",".join(_str(c.get("image")) for c in containers)]


# ------------------------------------------------------------------------------------------ pods

_POD_SUCCEEDED = [
    {"type": "Completed", "status": "True", "reason": "Succeeded", "message": "The pod has completed successfully."}
]
_POD_FAILED = [{"type": "Completed", "status": "True", "reason": "Failed", "message": "The pod failed."}]


def _restartable(container: Mapping[str, Any] | None) -> bool:
    return container is not None and container.get("restartPolicy") == "Always"


def _terminated_reason(terminated: Mapping[str, Any], prefix: str = "") -> str:
    reason = _str(terminated.get("reason"))
    if reason:
        return prefix + reason
    signal = _int(terminated.get("signal"))
    if signal != 0:
        return f"{prefix}Signal:{signal}"
    return f"{prefix}ExitCode:{_int(terminated.get('exitCode'))}"


def print_pod(pod: Obj) -> Cells:
    spec = _map(pod.get("spec"))
    status = _map(pod.get("status"))
    meta = _map(pod.get("metadata"))
    restarts = 0
    restartable_init_restarts = 0
    containers = _list(spec.get("containers"))
    init_containers = [_map(c) for c in _list(spec.get("initContainers"))]
    total = len(containers)
    ready = 0
    last_restart = ZERO_TIME
    last_restartable_restart = ZERO_TIME

    phase = _str(status.get("phase"))
    reason = phase
    if _str(status.get("reason")):
        reason = _str(status.get("reason"))
    conditions = [_map(c) for c in _list(status.get("conditions"))]
    for condition in conditions:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "SchedulingGated":
            reason = "SchedulingGated"

    row_conditions: list[dict[str, str]] = []
    if phase == "Succeeded":
        row_conditions = _POD_SUCCEEDED
    elif phase == "Failed":
        row_conditions = _POD_FAILED

    by_name: dict[str, Mapping[str, Any]] = {}
    for c in init_containers:
        by_name[_str(c.get("name"))] = c
        if _restartable(c):
            total += 1

    initializing = False
    for i, cs in enumerate(_list(status.get("initContainerStatuses"))):
        cs = _map(cs)
        restarts += _int(cs.get("restartCount"))
        last_terminated = _map(cs.get("lastState")).get("terminated")
        if last_terminated is not None:
            finished = _time(_map(last_terminated).get("finishedAt"))
            if last_restart < finished:
                last_restart = finished
        restartable = _restartable(by_name.get(_str(cs.get("name"))))
        if restartable:
            restartable_init_restarts += _int(cs.get("restartCount"))
            if last_terminated is not None:
                finished = _time(_map(last_terminated).get("finishedAt"))
                if last_restartable_restart < finished:
                    last_restartable_restart = finished
        state = _map(cs.get("state"))
        terminated = state.get("terminated")
        waiting = state.get("waiting")
        if terminated is not None and _int(_map(terminated).get("exitCode")) == 0:
            continue
        if restartable and cs.get("started") is True:
            if cs.get("ready") is True:
                ready += 1
            continue
        if terminated is not None:
            reason = _terminated_reason(_map(terminated), "Init:")
        elif waiting is not None and _str(_map(waiting).get("reason")) not in ("", "PodInitializing"):
            reason = "Init:" + _str(_map(waiting).get("reason"))
        else:
            reason = f"Init:{i}/{len(init_containers)}"
        initializing = True
        break

    if not initializing or _initialized(conditions):
        restarts = restartable_init_restarts
        last_restart = last_restartable_restart
        has_running = False
        error_reason = ""
        for cs in reversed(_list(status.get("containerStatuses"))):
            cs = _map(cs)
            restarts += _int(cs.get("restartCount"))
            last_terminated = _map(cs.get("lastState")).get("terminated")
            if last_terminated is not None:
                finished = _time(_map(last_terminated).get("finishedAt"))
                if last_restart < finished:
                    last_restart = finished
            state = _map(cs.get("state"))
            waiting = state.get("waiting")
            terminated = state.get("terminated")
            if waiting is not None and _str(_map(waiting).get("reason")):
                reason = _str(_map(waiting).get("reason"))
            elif terminated is not None:
                reason = _terminated_reason(_map(terminated))
                if _int(_map(terminated).get("exitCode")) != 0:
                    error_reason = reason
            elif cs.get("ready") is True and state.get("running") is not None:
                has_running = True
                ready += 1
        if reason == "Completed":
            if has_running and any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                reason = "Running"
            elif error_reason:
                reason = error_reason
            elif has_running:
                reason = "NotReady"

    deleting = meta.get("deletionTimestamp") is not None
    if deleting and _str(status.get("reason")) == NODE_UNREACHABLE_POD_REASON:
        reason = "Unknown"
    elif deleting and phase not in ("Failed", "Succeeded"):
        reason = "Terminating"

    restarts_cell: Cell = str(restarts)
    if restarts != 0 and last_restart != ZERO_TIME:
        restarts_cell = Since(last_restart, f"{restarts} (", " ago)")

    pod_ip = _str(status.get("podIP"))
    if not pod_ip:
        ips = _list(status.get("podIPs"))
        if ips:
            pod_ip = _str(_map(ips[0]).get("ip"))
    gates = _list(spec.get("readinessGates"))
    readiness_gates = "<none>"
    if gates:
        true = 0
        for gate in gates:
            wanted = _map(gate).get("conditionType")
            for condition in conditions:
                if condition.get("type") == wanted:
                    if condition.get("status") == "True":
                        true += 1
                    break
        readiness_gates = f"{true}/{len(gates)}"
    cells: list[Cell] = [
        _str(meta.get("name")),
        f"{ready}/{total}",
        reason,
        restarts_cell,
        _age(pod),
        pod_ip or "<none>",
        _str(spec.get("nodeName")) or "<none>",
        _str(status.get("nominatedNodeName")) or "<none>",
        readiness_gates,
    ]
    return cells, row_conditions


def _initialized(conditions: list[dict[str, Any]]) -> bool:
    for condition in conditions:
        if condition.get("type") == "Initialized":
            return bool(condition.get("status") == "True")
    return False


# ----------------------------------------------------------------------------------------- nodes


def node_roles(labels: Mapping[str, Any]) -> list[str]:
    """``findNodeRoles``: ``node-role.kubernetes.io/<role>`` keys and ``kubernetes.io/role`` values, sorted."""
    roles = set()
    for key, value in labels.items():
        if key.startswith(NODE_ROLE_PREFIX):
            role = key[len(NODE_ROLE_PREFIX) :]
            if role:
                roles.add(role)
        elif key == NODE_LABEL_ROLE and value != "":
            roles.add(_str(value))
    return sorted(roles)


def _node_address(status: Mapping[str, Any], kind: str) -> str:
    for address in _list(status.get("addresses")):
        address = _map(address)
        if address.get("type") == kind:
            return _str(address.get("address"))
    return "<none>"


def print_node(node: Obj) -> Cells:
    status = _map(node.get("status"))
    spec = _map(node.get("spec"))
    ready = None
    for condition in _list(status.get("conditions")):
        condition = _map(condition)
        if condition.get("type") == "Ready":
            ready = condition  # a map by type in Go: the last one wins
    states = []
    if ready is not None:
        states.append("Ready" if ready.get("status") == "True" else "NotReady")
    if not states:
        states.append("Unknown")
    if spec.get("unschedulable") is True:
        states.append("SchedulingDisabled")
    roles = ",".join(node_roles(_map(_map(node.get("metadata")).get("labels"))))
    info = _map(status.get("nodeInfo"))
    kernel = _str(info.get("kernelVersion")) or "<unknown>"
    if _str(info.get("architecture")):
        kernel += " (" + _str(info.get("architecture")) + ")"
    cells: list[Cell] = [
        _name(node),
        ",".join(states),
        roles or "<none>",
        _age(node),
        _str(info.get("kubeletVersion")),
        _node_address(status, "InternalIP"),
        _node_address(status, "ExternalIP"),
        _str(info.get("osImage")) or "<unknown>",
        kernel,
        _str(info.get("containerRuntimeVersion")) or "<unknown>",
    ]
    return cells, []


# -------------------------------------------------------------------------------- simple kinds


def print_namespace(obj: Obj) -> Cells:
    return [_name(obj), _str(_map(obj.get("status")).get("phase")), _age(obj)], []


def print_secret(obj: Obj) -> Cells:
    return [_name(obj), _str(obj.get("type")), len(_map(obj.get("data"))), _age(obj)], []


def print_service_account(obj: Obj) -> Cells:
    return [_name(obj), _age(obj)], []


def print_config_map(obj: Obj) -> Cells:
    return [_name(obj), len(_map(obj.get("data"))) + len(_map(obj.get("binaryData"))), _age(obj)], []


# -------------------------------------------------------------------------------------- services


def _load_balancer(status: Mapping[str, Any]) -> str:
    """``loadBalancerStatusStringer`` (wide: never truncated)."""
    found = set()
    for ingress in _list(_map(status.get("loadBalancer")).get("ingress")):
        ingress = _map(ingress)
        if _str(ingress.get("ip")):
            found.add(_str(ingress.get("ip")))
        elif _str(ingress.get("hostname")):
            found.add(_str(ingress.get("hostname")))
    return ",".join(sorted(found))


def _external_ip(svc: Obj) -> str:
    spec = _map(svc.get("spec"))
    kind = _str(spec.get("type"))
    external = [_str(ip) for ip in _list(spec.get("externalIPs"))]
    if kind in ("ClusterIP", "NodePort"):
        return ",".join(external) if external else "<none>"
    if kind == "LoadBalancer":
        lb = _load_balancer(_map(svc.get("status")))
        if external:
            return ",".join([*(lb.split(",") if lb else []), *external])
        return lb or "<pending>"
    if kind == "ExternalName":
        return _str(spec.get("externalName"))
    return "<unknown>"


def _ports(ports: list[Any]) -> str:
    pieces = []
    for port in ports:
        port = _map(port)
        node_port = _int(port.get("nodePort"))
        protocol = _str(port.get("protocol"))
        if node_port > 0:
            pieces.append(f"{_int(port.get('port'))}:{node_port}/{protocol}")
        else:
            pieces.append(f"{_int(port.get('port'))}/{protocol}")
    return ",".join(pieces)


def print_service(svc: Obj) -> Cells:
    spec = _map(svc.get("spec"))
    cluster_ips = _list(spec.get("clusterIPs"))
    ports = _ports(_list(spec.get("ports")))
    cells: list[Cell] = [
        _name(svc),
        _str(spec.get("type")),
        _str(cluster_ips[0]) if cluster_ips else "<none>",
        _external_ip(svc),
        ports or "<none>",
        _age(svc),
        format_labels(spec.get("selector")),
    ]
    return cells, []


# ----------------------------------------------------------------------------------- endpoints


def _join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _format_endpoints(subsets: list[Any]) -> str:
    if not subsets:
        return "<none>"
    out: list[str] = []
    limit = 3
    more = False
    count = 0
    for ss in subsets:
        ss = _map(ss)
        addresses = [_map(a) for a in _list(ss.get("addresses"))]
        ports = _list(ss.get("ports"))
        if not ports:
            count += len(addresses)
            for address in addresses:
                if len(out) == limit:
                    more = True
                    break
                out.append(_str(address.get("ip")))
            continue
        for port in ports:
            port_number = _int(_map(port).get("port"))
            count += len(addresses)
            for address in addresses:
                if len(out) == limit:
                    more = True
                    break
                out.append(_join_host_port(_str(address.get("ip")), port_number))
    text = ",".join(out)
    return f"{text} + {count - limit} more..." if more else text


def print_endpoints(obj: Obj) -> Cells:
    return [_name(obj), _format_endpoints(_list(obj.get("subsets"))), _age(obj)], []


def _list_with_more(out: list[str], more: bool, count: int, limit: int) -> str:
    text = ",".join(out)
    if more:
        return f"{text} + {count - limit} more..."
    return text or "<unset>"


def _discovery_ports(ports: list[Any]) -> str:
    out: list[str] = []
    limit, more, count = 3, False, 0
    for port in ports:
        port = _map(port)
        if len(out) < limit:
            number = "*"
            if port.get("port") is not None:
                number = str(_int(port.get("port")))
            elif port.get("name") is not None:
                number = _str(port.get("name"))
            out.append(number)
        elif len(out) == limit:
            more = True
        count += 1
    return _list_with_more(out, more, count, limit)


def _discovery_endpoints(endpoints: list[Any]) -> str:
    out: list[str] = []
    limit, more, count = 3, False, 0
    for endpoint in endpoints:
        for address in _list(_map(endpoint).get("addresses")):
            if len(out) < limit:
                out.append(_str(address))
            elif len(out) == limit:
                more = True
            count += 1
    return _list_with_more(out, more, count, limit)


def print_endpoint_slice(obj: Obj) -> Cells:
    cells: list[Cell] = [
        _name(obj),
        _str(obj.get("addressType")),
        _discovery_ports(_list(obj.get("ports"))),
        _discovery_endpoints(_list(obj.get("endpoints"))),
        _age(obj),
    ]
    return cells, []


# ------------------------------------------------------------------------------------ workloads


def print_deployment(obj: Obj) -> Cells:
    spec = _map(obj.get("spec"))
    status = _map(obj.get("status"))
    selector = selector_string(spec.get("selector"))
    cells: list[Cell] = [
        _name(obj),
        f"{_int(status.get('readyReplicas'))}/{_int(spec.get('replicas'))}",
        _int(status.get("updatedReplicas")),
        _int(status.get("availableReplicas")),
        _age(obj),
        *_container_cells(spec.get("template")),
        "<invalid>" if selector is None else selector,
    ]
    return cells, []


def print_replica_set(obj: Obj) -> Cells:
    spec = _map(obj.get("spec"))
    status = _map(obj.get("status"))
    cells: list[Cell] = [
        _name(obj),
        _int(spec.get("replicas")),
        _int(status.get("replicas")),
        _int(status.get("readyReplicas")),
        _age(obj),
        *_container_cells(spec.get("template")),
        format_label_selector(spec.get("selector")),
    ]
    return cells, []


def print_stateful_set(obj: Obj) -> Cells:
    spec = _map(obj.get("spec"))
    status = _map(obj.get("status"))
    cells: list[Cell] = [
        _name(obj),
        f"{_int(status.get('readyReplicas'))}/{_int(spec.get('replicas'))}",
        _age(obj),
        *_container_cells(spec.get("template")),
    ]
    return cells, []


def print_daemon_set(obj: Obj) -> Cells:
    spec = _map(obj.get("spec"))
    status = _map(obj.get("status"))
    template = _map(spec.get("template"))
    cells: list[Cell] = [
        _name(obj),
        _int(status.get("desiredNumberScheduled")),
        _int(status.get("currentNumberScheduled")),
        _int(status.get("numberReady")),
        _int(status.get("updatedNumberScheduled")),
        _int(status.get("numberAvailable")),
        format_labels(_map(template.get("spec")).get("nodeSelector")),
        _age(obj),
        *_container_cells(template),
        format_label_selector(spec.get("selector")),
    ]
    return cells, []


def _parse_group_version(text: str) -> tuple[str, str]:
    """``schema.ParseGroupVersion``; raises ``Unprintable`` where it errs (kube's Table request fails)."""
    if text in ("", "/"):
        return "", ""
    if text.count("/") == 0:
        return "", text
    if text.count("/") == 1:
        group, _, version = text.partition("/")
        return group, version
    raise Unprintable(f"unexpected GroupVersion string: {text}")


def _resource_name(group: str, kind: str, name: str) -> str:
    """``formatResourceName(GroupKind, name, withKind=true)``: ``kind.group/name``, lower-cased."""
    if not group and not kind:
        return name
    return (f"{kind}.{group}" if group else kind).lower() + "/" + name


def print_controller_revision(obj: Obj) -> Cells:
    controller = "<none>"
    for ref in _list(_map(obj.get("metadata")).get("ownerReferences")):
        ref = _map(ref)
        if ref.get("controller") is True:
            group, _ = _parse_group_version(_str(ref.get("apiVersion")))
            controller = _resource_name(group, _str(ref.get("kind")), _str(ref.get("name")))
            break
    return [_name(obj), controller, _int(obj.get("revision")), _age(obj)], []


# ------------------------------------------------------------------------------------- registry

POD = FunctionPrinter("pods", columns.POD, print_pod)
NODE = FunctionPrinter("nodes", columns.NODE, print_node)
NAMESPACE = FunctionPrinter("namespaces", columns.NAMESPACE, print_namespace)
SERVICE = FunctionPrinter("services", columns.SERVICE, print_service)
CONFIG_MAP = FunctionPrinter("configmaps", columns.CONFIG_MAP, print_config_map)
SECRET = FunctionPrinter("secrets", columns.SECRET, print_secret)
SERVICE_ACCOUNT = FunctionPrinter("serviceaccounts", columns.SERVICE_ACCOUNT, print_service_account)
ENDPOINTS = FunctionPrinter("endpoints", columns.ENDPOINTS, print_endpoints)
ENDPOINT_SLICE = FunctionPrinter("endpointslices", columns.ENDPOINT_SLICE, print_endpoint_slice)
DEPLOYMENT = FunctionPrinter("deployments", columns.DEPLOYMENT, print_deployment)
REPLICA_SET = FunctionPrinter("replicasets", columns.REPLICA_SET, print_replica_set)
STATEFUL_SET = FunctionPrinter("statefulsets", columns.STATEFUL_SET, print_stateful_set)
DAEMON_SET = FunctionPrinter("daemonsets", columns.DAEMON_SET, print_daemon_set)
CONTROLLER_REVISION = FunctionPrinter("controllerrevisions", columns.CONTROLLER_REVISION, print_controller_revision)

# (group, resource) → printer: the kinds ported, in the group kube serves them from.
PRINTERS: dict[tuple[str, str], FunctionPrinter] = {
    ("", "pods"): POD,
    ("", "nodes"): NODE,
    ("", "namespaces"): NAMESPACE,
    ("", "services"): SERVICE,
    ("", "configmaps"): CONFIG_MAP,
    ("", "secrets"): SECRET,
    ("", "serviceaccounts"): SERVICE_ACCOUNT,
    ("", "endpoints"): ENDPOINTS,
    ("discovery.k8s.io", "endpointslices"): ENDPOINT_SLICE,
    ("apps", "deployments"): DEPLOYMENT,
    ("apps", "replicasets"): REPLICA_SET,
    ("apps", "statefulsets"): STATEFUL_SET,
    ("apps", "daemonsets"): DAEMON_SET,
    ("apps", "controllerrevisions"): CONTROLLER_REVISION,
}


def print_default(obj: Obj) -> Cells:
    """``rest.NewDefaultTableConvertor``: the name and the creation time, absolute (RFC 3339, UTC)."""
    meta = _map(obj.get("metadata"))
    created = _time(meta.get("creationTimestamp"))
    return [_str(meta.get("name")), _rfc3339(created)], []


def _rfc3339(at: int) -> str:
    """``t.UTC().Format(time.RFC3339)`` (whole seconds; the zero time as Go prints it)."""
    seconds = at // 1_000_000_000
    days, rest = divmod(seconds, 86400)
    y, m, d = _civil_from_days(days)
    return f"{y:04d}-{m:02d}-{d:02d}T{rest // 3600:02d}:{rest // 60 % 60:02d}:{rest % 60:02d}Z"


def _civil_from_days(z: int) -> tuple[int, int, int]:
    z += 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    y = yoe + era * 400
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + (3 if mp < 10 else -9)
    return y + (m <= 2), m, d


# Its rows are appended to a nil slice: an empty list's are ``null``.
DEFAULT = FunctionPrinter("default", columns.DEFAULT, print_default, null_when_empty=True)

# Resources kube-apiserver registers with ``rest.NewDefaultTableConvertor`` (and no printer):
# their Tables are the default columns.
DEFAULT_TABLES = frozenset(
    {
        ("", "limitranges"),
        ("rbac.authorization.k8s.io", "roles"),
        ("rbac.authorization.k8s.io", "clusterroles"),
        ("apiextensions.k8s.io", "customresourcedefinitions"),
        ("storage.k8s.io", "csistoragecapacities"),
    }
)


def builtin_printer(group: str, resource: str) -> FunctionPrinter | None:
    """The printer kube-apiserver uses for a resource of its own, if the proxy has it."""
    printer = PRINTERS.get((group, resource))
    if printer is None and (group, resource) in DEFAULT_TABLES:
        return DEFAULT
    return printer
