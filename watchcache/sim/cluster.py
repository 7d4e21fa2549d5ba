"""The simulated cluster's storage and write path: a small, writable kube-apiserver.

Storage is one ``Cacher`` per resource type, so the sim's reads go through exactly the
read path the proxy serves; this module only adds the writes. Every write is one
*commit* at the next value of one global revision counter (as etcd's), applied to the
written type's cacher, announced to every other cacher as a progress notification (so
every type's list RV is the global revision, as a quorum read would report) and then
handed to subscribers (the in-process proxy feeds its own caches from that stream).

Semantics follow kube-apiserver closely enough that clients' error handling works
(codes, reasons and messages as ``k8s.io/apimachinery/pkg/api/errors`` builds them).
Deliberate simplifications, because the sim exists for demos and load:

* deletion is immediate: no graceful deletion, no finalizers, no ``Terminating``;
* there are no subresources: a PUT or PATCH may change ``status`` (kube would keep the
  old status on the main resource), and a create keeps a given pod status (kube resets
  it to ``Pending``); a pod without ``status.phase`` gets ``Pending``;
* only the validation kube's generic registry and name rules do (name format, required
  fields, immutable ``uid``); no per-kind schema validation, no admission beyond the
  namespace-exists check;
* a strategic merge patch is applied as a JSON merge patch minus its ``$`` directives, so
  lists are replaced whole (see ``watchcache.sim.patches``); no server-side apply.

With a ``state_file`` the sim persists like an apiserver on etcd: every commit is
appended to a journal (``watchcache.sim.journal``) before it is applied, and a restart
replays it to the same objects and revision. History does not survive: the restarted
sim's window starts at its revision, as after an etcd compaction, so a watch resuming
from before the restart gets 410 Gone and relists.
"""

from __future__ import annotations

import os
import random
import re
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from watchcache import apierrors
from watchcache.apierrors import StatusError
from watchcache.cache.events import ADDED, DELETED, MODIFIED
from watchcache.cache.object import CachedObject, encode_object, object_key
from watchcache.cache.store import CacheConfig
from watchcache.dispatch.cacher import Cacher
from watchcache.quoting import go_quote
from watchcache.resources import ResourceRegistry, ResourceType
from watchcache.sim.crds import CRDS, crd_status, served
from watchcache.sim.journal import Journal, load_state
from watchcache.sim.patches import apply_patch, parse_patch
from watchcache.watchers.watcher import CloseReason

Listener = Callable[[ResourceType, list[tuple[str, CachedObject]], int], None]

DEFAULT_REGISTRY = ResourceRegistry()
INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
# kube's NamespaceLifecycle refuses to delete these.
PROTECTED_NAMESPACES = frozenset({"default", "kube-system", "kube-public"})

# k8s.io/apimachinery/pkg/util/validation, verbatim so messages match.
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(_LABEL)
_DNS1123_SUBDOMAIN = re.compile(_LABEL + r"(\." + _LABEL + r")*")
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1123_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and "
    "end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_DNS1123_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_DNS1035_LABEL_MSG = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
    "character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for "
    "validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)
# utilrand.String's alphabet (no vowels, no confusable digits) and names.SimpleNameGenerator's limits.
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_GENERATE_SUFFIX = 5
_MAX_GENERATE_PREFIX = 63 - _GENERATE_SUFFIX
_CONFLICT_WHY = "the object has been modified; please apply your changes to the latest version and try again"
_NS_MISMATCH = "the namespace of the provided object does not match the namespace sent on the request"


class SimCluster:
    """An in-memory kube-apiserver: one global revision, one ``Cacher`` per resource type.

    Single-threaded like the cachers it feeds: call it from the event loop thread.
    ``seed`` makes uids and generated names reproducible (tests, load-test replays).
    ``state_file`` persists every commit there and, if it holds commits, starts from them
    (``restored`` is then True and the default namespaces are not created again); call
    ``close()`` when done with it.
    """

    def __init__(
        self,
        registry: ResourceRegistry = DEFAULT_REGISTRY,
        config: CacheConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        *,
        seed: int | None = None,
        state_file: str | os.PathLike[str] | None = None,
    ) -> None:
        self.registry = registry
        self.wall_clock = wall_clock
        self.rv = 1
        self.cachers: dict[ResourceType, Cacher] = {t: Cacher(t, config, clock) for t in registry.types}
        self._namespaces = registry.get("", "v1", "namespaces")
        # With CRDs served (``sim --crds``, sim/crds.py): the kinds they define, and a counter that
        # moves when the kinds do (discovery is rebuilt then).
        self._crds = registry.get(CRDS.group, CRDS.version, CRDS.resource)
        self._custom: dict[tuple[str, str, str], ResourceType] = {}
        self.registry_version = 0
        self._config, self._clock = config, clock
        if self._crds is not None and state_file is not None:
            raise ValueError("CRDs are not journaled: --crds cannot be used with --state-file")
        self._listeners: list[Listener] = []
        self._commits = 0
        self._rng = random.Random(seed)
        self._journal: Journal | None = None
        self.restored = False
        if state_file is not None:
            self._journal = Journal.open(state_file)
            try:
                state = load_state(self._journal, registry)
            except BaseException:
                self.close()
                raise
            if state.records:
                self.restored = True
                self.rv = state.rv
                for resource, cacher in self.cachers.items():
                    cacher.replace(state.objects[resource].values(), self.rv)
        if not self.restored:
            for cacher in self.cachers.values():
                cacher.replace([], self.rv)
            if self._namespaces is not None:  # journaled like any commit
                for name in INITIAL_NAMESPACES:
                    self.create(self._namespaces, "", {"metadata": {"name": name}})

    # ------------------------------------------------------------------ reads used by writers

    def cacher(self, resource: ResourceType) -> Cacher:
        """The cacher of ``resource``; 404 (as for an unknown path) if the sim does not serve it."""
        cacher = self.cachers.get(resource)
        if cacher is None:
            raise apierrors.path_not_found()
        return cacher

    def get(self, resource: ResourceType, namespace: str, name: str) -> CachedObject | None:
        key = object_key(namespace if resource.namespaced else "", name)
        return self.cacher(resource).cache.get(key)

    def namespace_exists(self, namespace: str) -> bool:
        """Without a namespaces resource in the registry every namespace is taken to exist."""
        if self._namespaces is None:
            return True
        return self.get(self._namespaces, "", namespace) is not None

    def commits(self) -> int:
        return self._commits

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(resource, changes, rv)`` after every later commit.

        A subscriber that needs the state before it subscribed takes it from
        ``cachers[r].cache.snapshot()`` at the same moment (nothing can commit in between).
        """
        self._listeners.append(listener)

    def close(self) -> None:
        """Close the state file's journal (later writes fail); a no-op without a state file."""
        if self._journal is not None:
            self._journal.close()

    def compact(self) -> int:
        """Forget all history (an etcd compaction at the current revision): old-rv reads and watches get 410."""
        for cacher in self.cachers.values():
            cacher.cache.history.reset(cacher.rv)
        return self.rv

    # ------------------------------------------------------------------ writes

    def create(self, resource: ResourceType, namespace: str, obj: dict[str, Any]) -> CachedObject:
        """POST: validate, set the server fields and commit ADDED. Takes ownership of ``obj``."""
        cacher = self.cacher(resource)
        _check_type_meta(resource, obj)
        meta = _metadata(resource, obj)
        body_ns = _str_field(resource, meta, "namespace")
        name = _str_field(resource, meta, "name")
        generate = _str_field(resource, meta, "generateName")
        if resource.namespaced:
            if body_ns and body_ns != namespace:
                raise apierrors.bad_request(_NS_MISMATCH)
            if not namespace:
                raise _invalid(resource, name, "metadata.namespace", "FieldValueRequired", "Required value")
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if not name and not generate:
            raise _invalid(
                resource, "", "metadata.name", "FieldValueRequired", "Required value: name or generateName is required"
            )
        if name:
            _validate_name(resource, name)
        else:
            _validate_name(resource, generate[:_MAX_GENERATE_PREFIX] + "x" * _GENERATE_SUFFIX)
        if meta.get("resourceVersion"):
            # What kube's etcd3 storage answers (surfaced as an internal error).
            raise apierrors.internal_error(
                "Internal error occurred: resourceVersion should not be set on objects to be created"
            )
        if resource.namespaced and not self.namespace_exists(namespace):
            raise apierrors.not_found("", "namespaces", namespace)
        if not name:
            name = self._generate_name(cacher, namespace, generate)
        elif cacher.cache.get(object_key(meta.get("namespace", ""), name)) is not None:
            raise apierrors.already_exists(resource.group, resource.resource, name)
        meta["name"] = name
        meta["uid"] = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
        meta["creationTimestamp"] = _timestamp(self.wall_clock())
        for server_only in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(server_only, None)
        _default_on_create(resource, obj, meta)
        if resource == self._crds:
            crd_status(obj)
        return self._commit(cacher, ADDED, obj)

    def update(self, resource: ResourceType, namespace: str, name: str, obj: dict[str, Any]) -> CachedObject:
        """PUT: replace the object; ``metadata.resourceVersion`` in the body is a precondition."""
        cacher = self.cacher(resource)
        current = self._existing(resource, namespace, name)
        return self._replace(cacher, current, namespace, name, obj)

    def patch(self, resource: ResourceType, namespace: str, name: str, patch_type: str, patch: bytes) -> CachedObject:
        """PATCH: apply the patch to the stored object (with its TypeMeta), then commit as an update."""
        cacher = self.cacher(resource)
        media_type, document = parse_patch(patch_type, patch)
        current = self._existing(resource, namespace, name)
        target = {"kind": resource.kind, "apiVersion": resource.api_version, **current.decode()}
        patched = apply_patch(media_type, document, target)
        return self._replace(cacher, current, namespace, name, patched)

    def delete(self, resource: ResourceType, namespace: str, name: str) -> CachedObject:
        """Immediate delete; a namespace takes everything in it along, one commit per object."""
        cacher = self.cacher(resource)
        current = self._existing(resource, namespace, name)
        if resource == self._crds:  # kube's customresourcecleanup: the objects go first
            self._delete_objects(served([current.decode()]).values())
        if resource == self._namespaces:
            if name in PROTECTED_NAMESPACES:
                raise StatusError(
                    403,
                    "Forbidden",
                    f'namespaces "{name}" is forbidden: this namespace may not be deleted',
                    details={"name": name, "kind": "namespaces"},
                )
            self._delete_namespace_contents(name)
        rv = self.rv + 1
        return self._commit_object(cacher, DELETED, current.with_resource_version(rv))

    # ------------------------------------------------------------------ internals

    def _existing(self, resource: ResourceType, namespace: str, name: str) -> CachedObject:
        current = self.get(resource, namespace, name)
        if current is None:
            raise apierrors.not_found(resource.group, resource.resource, name)
        return current

    def _replace(
        self, cacher: Cacher, current: CachedObject, namespace: str, name: str, obj: dict[str, Any]
    ) -> CachedObject:
        resource = cacher.resource
        _check_type_meta(resource, obj)
        obj.pop("kind", None)
        obj.pop("apiVersion", None)
        meta = _metadata(resource, obj)
        body_name = _str_field(resource, meta, "name")
        if body_name != name:
            raise apierrors.bad_request(
                f"the name of the object ({body_name}) does not match the name on the URL ({name})"
            )
        if resource.namespaced:
            body_ns = _str_field(resource, meta, "namespace")
            if body_ns and body_ns != namespace:
                raise apierrors.bad_request(_NS_MISMATCH)
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        old = current.decode()
        old_meta = old["metadata"]
        precondition = meta.get("resourceVersion")
        if precondition and precondition != old_meta.get("resourceVersion"):
            raise apierrors.conflict(resource.group, resource.resource, name, _CONFLICT_WHY)
        uid = meta.get("uid")
        if uid and uid != old_meta.get("uid"):
            raise _invalid(
                resource,
                name,
                "metadata.uid",
                "FieldValueInvalid",
                f"Invalid value: {go_quote(uid)}: field is immutable",
            )
        for kept in ("uid", "creationTimestamp", "generation"):
            if kept in old_meta:
                meta[kept] = old_meta[kept]
            else:
                meta.pop(kept, None)
        if resource.kind == "Deployment" and obj.get("spec") != old.get("spec"):
            meta["generation"] = int(old_meta.get("generation", 0)) + 1
        if resource == self._namespaces:
            # kube's namespace strategy: spec.finalizers and status only change through subresources.
            for kept in ("spec", "status"):
                if kept in old:
                    obj[kept] = old[kept]
            _namespace_label(meta, name)
        _default_pod_phase(resource, obj)
        if resource == self._crds:
            crd_status(obj)
        meta["resourceVersion"] = old_meta.get("resourceVersion")
        if obj == old:
            return current  # kube's storage skips a write that changes nothing: no new revision, no event
        return self._commit(cacher, MODIFIED, obj)

    def _commit(self, cacher: Cacher, event_type: str, obj: dict[str, Any]) -> CachedObject:
        rv = self.rv + 1
        obj["metadata"]["resourceVersion"] = str(rv)
        try:
            cached = encode_object(cacher.resource, obj)
        except ValueError as err:  # ObjectError: the validation above should make this unreachable
            raise apierrors.bad_request(str(err)) from None
        return self._commit_object(cacher, event_type, cached)

    def _commit_object(self, cacher: Cacher, event_type: str, cached: CachedObject) -> CachedObject:
        if self._journal is not None:  # write-ahead: a commit that is not on disk did not happen
            self._journal.append(cacher.resource, event_type, cached, cached.rv)
        self.rv = rv = cached.rv
        changes = [(event_type, cached)]
        cacher.apply(changes)
        for other in self.cachers.values():
            if other is not cacher:
                other.progress(rv)
        self._commits += 1
        for listener in self._listeners:
            listener(cacher.resource, changes, rv)
        if cacher.resource == self._crds:
            self._follow_crds()
        return cached

    def _follow_crds(self) -> None:
        """Serve what the CRDs define now: new kinds added, kinds gone or changed removed (sim/crds.py)."""
        crds = self.cachers[self._crds] if self._crds is not None else None
        if crds is None:
            return
        desired = served([o.decode() for o in crds.cache.snapshot().iter_range("", None)])
        for gvr, old in list(self._custom.items()):
            if desired.get(gvr) != old:
                self._delete_objects([old])
                cacher = self.cachers.pop(old)
                for watcher in list(cacher.dispatcher.watchers()):
                    watcher.close(CloseReason.CACHE_STOPPED)
                cacher.stop()
                self.registry.remove(old)
                del self._custom[gvr]
                self.registry_version += 1
        for gvr, new in desired.items():
            if gvr in self._custom or self.registry.get(*gvr) is not None:
                continue
            cacher = self.cachers[new] = Cacher(new, self._config, self._clock)
            cacher.replace([], self.rv)
            self.registry.add(new)
            self._custom[gvr] = new
            self.registry_version += 1

    def _delete_objects(self, resources: Iterable[ResourceType]) -> None:
        """Every object of ``resources``, deleted: a commit (a DELETED event) each."""
        for resource in resources:
            cacher = self.cachers.get(resource)
            if cacher is None:
                continue
            for obj in list(cacher.cache.snapshot().iter_range("", None)):
                self._commit_object(cacher, DELETED, obj.with_resource_version(self.rv + 1))

    def _delete_namespace_contents(self, namespace: str) -> None:
        prefix = namespace + "/"
        for resource, cacher in self.cachers.items():
            if not resource.namespaced:
                continue
            # "/" + 1 == "0": the range holds exactly the keys "<namespace>/...".
            doomed = list(cacher.cache.snapshot().iter_range(prefix, namespace + "0"))
            for obj in doomed:
                self._commit_object(cacher, DELETED, obj.with_resource_version(self.rv + 1))

    def _generate_name(self, cacher: Cacher, namespace: str, prefix: str) -> str:
        prefix = prefix[:_MAX_GENERATE_PREFIX]
        for _ in range(8):  # kube retries a generated name that collides, a few times
            name = prefix + "".join(self._rng.choices(_GENERATE_ALPHABET, k=_GENERATE_SUFFIX))
            if cacher.cache.get(object_key(namespace if cacher.resource.namespaced else "", name)) is None:
                return name
        raise apierrors.already_exists(cacher.resource.group, cacher.resource.resource, name)


# ---------------------------------------------------------------------- validation helpers


def _check_type_meta(resource: ResourceType, obj: dict[str, Any]) -> None:
    """kind/apiVersion are optional in a body, but must name this resource if present."""
    kind = obj.get("kind")
    api_version = obj.get("apiVersion")
    if api_version not in (None, "") and api_version != resource.api_version:
        raise apierrors.bad_request(
            f"the API version in the data ({api_version}) does not match the expected API version "
            f"({resource.api_version})"
        )
    if kind not in (None, "") and kind != resource.kind:
        raise apierrors.bad_request(
            f'{kind} in version "{resource.version}" cannot be handled as a {resource.kind}: '
            f"the kind in the data does not match the resource"
        )


def _undecodable(resource: ResourceType, why: str) -> StatusError:
    return apierrors.bad_request(
        f'{resource.kind} in version "{resource.version}" cannot be handled as a {resource.kind}: {why}'
    )


def _metadata(resource: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.setdefault("metadata", {})
    if meta is None:
        meta = obj["metadata"] = {}
    if not isinstance(meta, dict):
        raise _undecodable(resource, "metadata must be an object")
    for field in ("labels", "annotations"):
        value = meta.get(field)
        if value is None:
            meta.pop(field, None)
        elif not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise _undecodable(resource, f"metadata.{field} must be a map of strings")
    return meta


def _str_field(resource: ResourceType, meta: dict[str, Any], field: str) -> str:
    value = meta.get(field)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _undecodable(resource, f"metadata.{field} must be a string")
    return value


def _validate_name(resource: ResourceType, name: str) -> None:
    """kube's per-kind name rule: namespaces are DNS-1123 labels, services DNS-1035 labels, the rest subdomains."""
    if resource.kind == "Namespace":
        pattern, msg, limit = _DNS1123_LABEL, _DNS1123_LABEL_MSG, 63
    elif resource.kind == "Service":
        pattern, msg, limit = _DNS1035_LABEL, _DNS1035_LABEL_MSG, 63
    else:
        pattern, msg, limit = _DNS1123_SUBDOMAIN, _DNS1123_SUBDOMAIN_MSG, 253
    causes = []
    if len(name) > limit:
        causes.append(
            (
                "metadata.name",
                "FieldValueInvalid",
                f"Invalid value: {go_quote(name)}: must be no more than {limit} characters",
            )
        )
    if not pattern.fullmatch(name):
        causes.append(("metadata.name", "FieldValueInvalid", f"Invalid value: {go_quote(name)}: {msg}"))
    if causes:
        raise apierrors.invalid(resource.kind, resource.group, name, causes)


def _invalid(resource: ResourceType, name: str, field: str, reason: str, message: str) -> StatusError:
    return apierrors.invalid(resource.kind, resource.group, name, [(field, reason, message)])


def _timestamp(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


def _default_on_create(resource: ResourceType, obj: dict[str, Any], meta: dict[str, Any]) -> None:
    """The strategies' PrepareForCreate that matter to clients (see module docstring for what is skipped)."""
    if resource.kind == "Deployment":
        meta["generation"] = 1
    elif resource.kind == "Namespace":
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            spec = obj["spec"] = {}
        finalizers = spec.get("finalizers")
        if not isinstance(finalizers, list):
            finalizers = []
        if "kubernetes" not in finalizers:
            finalizers = [*finalizers, "kubernetes"]
        spec["finalizers"] = finalizers
        obj["status"] = {"phase": "Active"}
        _namespace_label(meta, meta["name"])
    _default_pod_phase(resource, obj)


def _default_pod_phase(resource: ResourceType, obj: dict[str, Any]) -> None:
    if resource.kind != "Pod":
        return
    status = obj.get("status")
    if not isinstance(status, dict):
        status = obj["status"] = {}
    if not status.get("phase"):
        status["phase"] = "Pending"


def _namespace_label(meta: dict[str, Any], name: str) -> None:
    """kube (1.21+) labels every namespace with its own name so selectors can pick namespaces by name."""
    labels = meta.get("labels") or {}
    meta["labels"] = {**labels, "kubernetes.io/metadata.name": name}
