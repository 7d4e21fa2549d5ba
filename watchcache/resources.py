"""Resource types: what the proxy knows about each kind it caches.

A ``ResourceType`` is the group/version/resource triple plus what every layer needs
to serve it without asking the upstream again: the kind (for ``PodList`` and the
typed prefix of every encoded object), the scope, the selectable fields with how to
extract them (the equivalent of kube's ``GetAttrs``/``ToSelectableFields``), and the
one *trigger* field watchers are indexed by (as kube's cacher ``IndexerFuncs``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

FieldGetter = Callable[[Mapping[str, Any]], str]


def _path_getter(path: str, zero: str = "") -> FieldGetter:
    """One field's value, as kube's field selectors see it: the reference ``compile_fields`` must agree with.

    ``zero``: the value of an absent field. kube selects on its typed objects, where an omitted
    bool is false (``strconv.FormatBool``): ``spec.hostNetwork=false`` matches a pod without one.
    """
    parts = tuple(path.split("."))

    def get(obj: Mapping[str, Any]) -> str:
        value: Any = obj
        for part in parts:
            # dict first: decoded JSON is always a dict, and an ABC isinstance costs ~10x more.
            if not isinstance(value, dict) and not isinstance(value, Mapping):
                return zero
            value = value.get(part)
            if value is None:
                return zero
        return _field_string(value)

    return get


def _field_string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    return ""


def _child(value: Any, key: str) -> Any:
    """``value[key]`` if ``value`` is a mapping that has it, else None (the slow path of compiled extractors)."""
    if isinstance(value, Mapping):
        return value.get(key)
    return None


def _leaf(value: Any) -> str:
    return "" if value is None else _field_string(value)


def _false_leaf(value: Any) -> str:
    return "false" if value is None else _field_string(value)


FieldsExtractor = Callable[[Mapping[str, Any]], dict[str, str]]


def compile_fields(paths: Sequence[str], zeros: Mapping[str, str] | None = None) -> FieldsExtractor:
    """One function extracting every selectable field, each shared path prefix walked once.

    Every object entering the cache has its fields extracted (invariant 5): for pods that was
    ten path walks of ~1 µs each, per event. Generated like ``dataclasses`` generates
    ``__init__``: a plain function of dict lookups, with the exact semantics of
    ``_path_getter`` (tests/test_resources.py holds them equal).
    """
    names: dict[tuple[str, ...], str] = {(): "obj"}
    body: list[str] = []
    for path in paths:
        parts = tuple(path.split("."))
        for i in range(1, len(parts) + 1):
            prefix = parts[:i]
            if prefix in names:
                continue
            var = names[prefix] = f"v{len(names)}"
            parent = names[parts[: i - 1]]
            key = repr(prefix[-1])
            body.append(f"    {var} = {parent}.get({key}) if type({parent}) is dict else _child({parent}, {key})")
    zeros = zeros or {}
    if any(z not in ("", "false") for z in zeros.values()):
        raise ValueError(f"field zero values are '' or 'false': {zeros}")
    items = ", ".join(
        f"{path!r}: {v} if type({v}) is str else {'_false_leaf' if zeros.get(path) == 'false' else '_leaf'}({v})"
        for path, v in ((path, names[tuple(path.split("."))]) for path in paths)
    )
    source = "\n".join(["def extract(obj):", *body, f"    return {{{items}}}"])
    namespace: dict[str, Any] = {"_child": _child, "_leaf": _leaf, "_false_leaf": _false_leaf}
    exec(compile(source, f"<fields {', '.join(paths)}>", "exec"), namespace)  # our own paths, keys repr'd
    extract: FieldsExtractor = namespace["extract"]
    return extract


# The API groups kube-apiserver serves itself. Everything else is a custom resource (served by the
# apiextensions handler as unstructured objects) or an aggregated API. The differences a client sees:
# a built-in group has go-restful's router layer in front (server/negotiation.py), a custom
# resource's LIST items keep their kind/apiVersion, and its field selectors are the CRD's.
BUILTIN_GROUPS = frozenset(
    {
        "",
        "admissionregistration.k8s.io",
        "apiextensions.k8s.io",
        "apiregistration.k8s.io",
        "apps",
        "authentication.k8s.io",
        "authorization.k8s.io",
        "autoscaling",
        "batch",
        "certificates.k8s.io",
        "coordination.k8s.io",
        "discovery.k8s.io",
        "events.k8s.io",
        "flowcontrol.apiserver.k8s.io",
        "internal.apiserver.k8s.io",
        "networking.k8s.io",
        "node.k8s.io",
        "policy",
        "rbac.authorization.k8s.io",
        "resource.k8s.io",
        "scheduling.k8s.io",
        "storage.k8s.io",
        "storagemigration.k8s.io",
    }
)


# Selectable fields of built-in kinds whose absence reads as "false": bools of kube's typed objects
# (pods' ``spec.hostNetwork``, nodes' ``spec.unschedulable``, formatted by ``strconv.FormatBool`` in their
# ``ToSelectableFields``), as the protobuf caches read them too (kubeproto/objects.py).
_ZERO_FIELDS: dict[tuple[str, str], dict[str, str]] = {
    ("", "Pod"): {"spec.hostNetwork": "false"},
    ("", "Node"): {"spec.unschedulable": "false"},
}


# What kube-apiserver serves from etcd by default, with no watch cache (``DefaultWatchCacheSizes`` of
# pkg/kubeapiserver: events of both groups, size 0). Their watches send no bookmark, so no probe proves a
# cache of them (upstream/probes.py), and their reads are etcd's, in its words (cache/semantics.py).
_UNCACHED_BY_KUBE = frozenset({("", "events"), ("events.k8s.io", "events")})

# Built-in kinds whose field-label conversion (k8s.io/kubernetes/pkg/apis/*/conversion.go) leaves out
# metadata.namespace, which runtime.DefaultMetaV1FieldSelectorConversion (every other kind) accepts:
# kube refuses `metadata.namespace=...` on them with 400, cluster-scoped or not.
_NO_NAMESPACE_FIELD = frozenset(
    {
        ("", "Node"),
        ("", "Namespace"),
        ("certificates.k8s.io", "CertificateSigningRequest"),
        ("certificates.k8s.io", "ClusterTrustBundle"),
        ("certificates.k8s.io", "PodCertificateRequest"),
        ("resource.k8s.io", "ResourceSlice"),
    }
)


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    resource: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    # Fields a fieldSelector may name, beyond metadata.name/metadata.namespace.
    extra_fields: tuple[str, ...] = ()
    # The field whose exact value indexes watchers (kube: pods by spec.nodeName).
    trigger_field: str | None = None
    categories: tuple[str, ...] = ()
    # Field labels kube's conversion accepts that its field set never holds (a pod's status.podIPs:
    # pkg/apis/core/v1/conversion.go names it, ToSelectableFields does not): they select as "".
    unset_fields: tuple[str, ...] = ()
    # False for a kind whose selectable fields this table does not hold (a built-in kind learned from
    # discovery, e.g. events): a field selector beyond metadata.name/namespace goes to the upstream.
    known_fields: bool = True
    getters: Mapping[str, FieldGetter] = field(init=False, repr=False, compare=False)
    extract_fields: FieldsExtractor = field(init=False, repr=False, compare=False)
    typed_prefix: bytes = field(init=False, repr=False, compare=False)
    # How an encoded object of this type starts, TypeMeta first: kube's order (built-in types), and
    # the sorted one (unstructured objects: custom resources). See cache/object.py body_in_event.
    object_prefixes: tuple[bytes, bytes] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        scope = ("metadata.namespace",) if self.namespace_selectable else ()
        fields = ("metadata.name", *scope, *self.extra_fields)
        zeros = _ZERO_FIELDS.get((self.group, self.kind), {}) if not self.custom else {}
        object.__setattr__(self, "getters", {f: _path_getter(f, zeros.get(f, "")) for f in fields})
        object.__setattr__(self, "extract_fields", compile_fields(fields, zeros))
        # Every object's JSON is stored without its opening brace; this prefix turns it
        # back into a typed object for GET and watch frames at the cost of a writelines. A custom
        # resource's is the sorted order: kube writes unstructured objects as Go writes a map.
        prefix = b'{"kind":"' + self.kind.encode() + b'","apiVersion":"' + self.api_version.encode() + b'",'
        sorted_prefix = b'{"apiVersion":"' + self.api_version.encode() + b'","kind":"' + self.kind.encode() + b'",'
        object.__setattr__(self, "typed_prefix", sorted_prefix if self.custom else prefix)
        object.__setattr__(self, "object_prefixes", (prefix, sorted_prefix))

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def custom(self) -> bool:
        """A custom resource (or an aggregated API's): not in a group kube-apiserver serves itself."""
        return self.group not in BUILTIN_GROUPS

    @property
    def namespace_selectable(self) -> bool:
        """Whether a field selector may name metadata.namespace: not a cluster-scoped custom resource
        (kube's crConverter), nor a kind whose conversion leaves it out (``_NO_NAMESPACE_FIELD``)."""
        if self.custom:
            return self.namespaced
        return (self.group, self.kind) not in _NO_NAMESPACE_FIELD

    @property
    def uncached_by_kube(self) -> bool:
        """kube-apiserver gives this resource no watch cache by default (``_UNCACHED_BY_KUBE``)."""
        return (self.group, self.resource) in _UNCACHED_BY_KUBE

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    @property
    def selectable_fields(self) -> frozenset[str]:
        return frozenset((*self.getters, *self.unset_fields))

    @property
    def qualified(self) -> str:
        """``pods`` or ``deployments.apps``: the form kube uses in messages and metric labels."""
        return f"{self.resource}.{self.group}" if self.group else self.resource

    def path_id(self) -> str:
        """``pods`` or ``apps/v1/deployments``: the form of the ``--resources`` flag."""
        return f"{self.group}/{self.version}/{self.resource}" if self.group else self.resource


CORE = ""

NAMESPACES = ResourceType(
    CORE, "v1", "namespaces", "Namespace", False, "namespace", ("ns",), ("status.phase",), "metadata.name"
)
PODS = ResourceType(
    CORE,
    "v1",
    "pods",
    "Pod",
    True,
    "pod",
    ("po",),
    (
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ),
    "spec.nodeName",
    ("all",),
    unset_fields=("status.podIPs",),
)
CONFIGMAPS = ResourceType(CORE, "v1", "configmaps", "ConfigMap", True, "configmap", ("cm",), (), "metadata.name")
SECRETS = ResourceType(CORE, "v1", "secrets", "Secret", True, "secret", (), ("type",), "metadata.name")
NODES = ResourceType(CORE, "v1", "nodes", "Node", False, "node", ("no",), ("spec.unschedulable",), "metadata.name")
# A Service's spec.clusterIP and spec.type (kube >= 1.31): kubelet's and kube-proxy's Service informers
# select spec.clusterIP!=None.
SERVICES = ResourceType(
    CORE, "v1", "services", "Service", True, "service", ("svc",), ("spec.clusterIP", "spec.type"), None, ("all",)
)
SERVICEACCOUNTS = ResourceType(CORE, "v1", "serviceaccounts", "ServiceAccount", True, "serviceaccount", ("sa",))
DEPLOYMENTS = ResourceType(
    "apps", "v1", "deployments", "Deployment", True, "deployment", ("deploy",), (), None, ("all",)
)
# The rest of the proxy's default resources (upstream/discovery.py DEFAULT_RESOURCES), with kube's short
# names and categories. (A ReplicaSet's status.replicas is in its strategy's field set, but apps/v1
# registers no conversion for the label: kube refuses it, "is not a known field selector".)
ENDPOINTS = ResourceType(CORE, "v1", "endpoints", "Endpoints", True, "endpoints", ("ep",))
REPLICASETS = ResourceType("apps", "v1", "replicasets", "ReplicaSet", True, "replicaset", ("rs",), (), None, ("all",))
STATEFULSETS = ResourceType(
    "apps", "v1", "statefulsets", "StatefulSet", True, "statefulset", ("sts",), (), None, ("all",)
)
DAEMONSETS = ResourceType("apps", "v1", "daemonsets", "DaemonSet", True, "daemonset", ("ds",), (), None, ("all",))
ENDPOINTSLICES = ResourceType("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True, "endpointslice")
# API Priority and Fairness's configuration: followed by flow control (service/flowconfig.py), not
# cached; served by the simulated cluster with ``--flowcontrol``.
FLOWSCHEMAS = ResourceType("flowcontrol.apiserver.k8s.io", "v1", "flowschemas", "FlowSchema", False, "flowschema")
PRIORITYLEVELCONFIGURATIONS = ResourceType(
    "flowcontrol.apiserver.k8s.io", "v1", "prioritylevelconfigurations", "PriorityLevelConfiguration", False,
    "prioritylevelconfiguration",
)  # fmt: skip
FLOWCONTROL = (FLOWSCHEMAS, PRIORITYLEVELCONFIGURATIONS)

BUILTIN: tuple[ResourceType, ...] = (
    NAMESPACES,
    PODS,
    CONFIGMAPS,
    SECRETS,
    NODES,
    SERVICES,
    SERVICEACCOUNTS,
    DEPLOYMENTS,
    ENDPOINTS,
    REPLICASETS,
    STATEFULSETS,
    DAEMONSETS,
    ENDPOINTSLICES,
)


class ResourceRegistry:
    """Lookup of resource types by (group, version, resource) and by ``--resources`` id."""

    def __init__(self, types: tuple[ResourceType, ...] = BUILTIN) -> None:
        self.types = types
        self._by_gvr = {(t.group, t.version, t.resource): t for t in types}

    def get(self, group: str, version: str, resource: str) -> ResourceType | None:
        return self._by_gvr.get((group, version, resource))

    def add(self, resource: ResourceType) -> None:
        """Register a type learned from the upstream's discovery (replacing one with the same GVR)."""
        self.remove(resource)
        self.types = (*self.types, resource)
        self._by_gvr[(resource.group, resource.version, resource.resource)] = resource

    def remove(self, resource: ResourceType) -> None:
        gvr = (resource.group, resource.version, resource.resource)
        old = self._by_gvr.pop(gvr, None)
        if old is not None:
            self.types = tuple(t for t in self.types if t is not old)

    def group_versions(self) -> dict[str, list[str]]:
        """Group name → versions served, in registration order (``""`` is the core group)."""
        out: dict[str, list[str]] = {}
        for t in self.types:
            versions = out.setdefault(t.group, [])
            if t.version not in versions:
                versions.append(t.version)
        return out

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        return [t for t in self.types if t.group == group and t.version == version]

    def by_id(self, path_id: str) -> ResourceType | None:
        return next((t for t in self.types if t.path_id() == path_id), None)

    def select(self, ids: list[str]) -> ResourceRegistry:
        """The registry restricted to ``--resources`` ids (``pods``, ``apps/v1/deployments``)."""
        by_id = {t.path_id(): t for t in self.types}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise KeyError(", ".join(missing))
        return ResourceRegistry(tuple(by_id[i] for i in ids))
