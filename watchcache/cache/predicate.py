"""SelectionPredicate: namespace + label selector + field selector + shard selector, on cached attributes.

The same predicate filters LIST items and decides watch deliveries, so a watch and a
list with the same parameters always agree on what they select. It reads the attributes
extracted when the object entered the cache, never its JSON (invariant 5).
"""

from __future__ import annotations

from watchcache.cache.events import WatchEvent
from watchcache.cache.object import CachedObject
from watchcache.cache.shardhash import in_shard
from watchcache.quoting import go_quote
from watchcache.resources import ResourceType
from watchcache.selectors import (
    FieldSelector,
    LabelSelector,
    SelectorError,
    UnsupportedFieldError,
    parse_field_selector,
    parse_label_selector,
)
from watchcache.selectors.shards import ShardSelector, parse_shard_selector

_NOT_SUPPORTED = "field label not supported: {}"
# Built-in kinds whose field selectors kube converts with a function of their own, and how it words
# a field it does not know (k8s.io/kubernetes/pkg/apis/*/conversion.go). The others use
# runtime.DefaultMetaV1FieldSelectorConversion's message (``_default_message``).
_CONVERSION_MESSAGES: dict[tuple[str, str], str] = {
    **{("", kind): _NOT_SUPPORTED for kind in ("Pod", "Node", "ReplicationController", "Event", "Namespace",
                                               "Secret", "Service")},
    ("certificates.k8s.io", "CertificateSigningRequest"): _NOT_SUPPORTED,
    ("events.k8s.io", "Event"): _NOT_SUPPORTED,
    ("batch", "Job"): "field label {q} not supported for Job",
}  # fmt: skip


class UnsupportedField(SelectorError):
    """A field selector names a field the resource cannot select, worded as kube words it for the
    kind. For a custom resource (``custom``) only the upstream knows: the CRD's selectableFields."""

    def __init__(self, resource: ResourceType, field: str) -> None:
        template = _CONVERSION_MESSAGES.get((resource.group, resource.kind))
        if resource.custom:
            template = _NOT_SUPPORTED
        if template is None:
            message = f'{go_quote(field)} is not a known field selector: only "metadata.name", "metadata.namespace"'
        else:
            message = template.format(field, q=go_quote(field))
        super().__init__(message)
        self.field = field
        # Only the upstream knows: a CRD's selectableFields, or a built-in kind learned from discovery.
        self.custom = resource.custom or not resource.known_fields


class SelectionPredicate:
    __slots__ = ("empty", "fields", "filters", "labels", "namespace", "selects_all", "shard")

    def __init__(
        self, namespace: str | None, labels: LabelSelector, fields: FieldSelector, shard: ShardSelector | None = None
    ) -> None:
        self.namespace = namespace or None
        self.labels = labels
        self.fields = fields
        self.shard = shard
        # "empty" means no label or field selector: kube then reports remainingItemCount, even
        # for a sharded list (its count of the unfiltered rest: ``SelectionPredicate.Empty``).
        self.empty = labels.empty and fields.empty
        # Whether an object in the scope may be left out: a selector of any kind.
        self.filters = not self.empty or shard is not None
        # No namespace and no selector: every object matches (the common informer watch).
        self.selects_all = self.namespace is None and not self.filters

    @classmethod
    def parse(
        cls,
        resource: ResourceType,
        namespace: str | None,
        label_selector: str,
        field_selector: str,
        shard_selector: str = "",
    ) -> SelectionPredicate:
        """Raises SelectorError (a 400 for the client) on bad syntax, UnsupportedField on a field the
        resource cannot select, ShardSelectorError on a shardSelector kube refuses (a 500, as kube).

        An empty ``shard_selector`` is no selector, as kube treats the parameter's absence."""
        labels = parse_label_selector(label_selector)  # first, as kube decodes the parameters
        try:
            fields = parse_field_selector(field_selector, resource.selectable_fields)
        except UnsupportedFieldError as e:
            raise UnsupportedField(resource, e.field) from None
        shard = parse_shard_selector(shard_selector) if shard_selector else None
        return cls(namespace if resource.namespaced else None, labels, fields, shard)

    def matches(self, obj: CachedObject) -> bool:
        if self.namespace is not None and obj.namespace != self.namespace:
            return False
        # selector_matches, inlined: this runs per event and watcher group on the fan-out path.
        if self.shard is not None and not in_shard(self.shard, obj):
            return False
        if not self.labels.empty and not self.labels.matches(obj.labels):
            return False
        return self.fields.empty or self.fields.matches(obj.fields)

    def concerns(self, event: WatchEvent) -> bool:
        """Whether a watch with this predicate may get a frame for ``event`` (its new or previous state matches)."""
        if self.selects_all:
            return True
        return self.matches(event.object) or (event.prev is not None and self.matches(event.prev))

    def selector_matches(self, obj: CachedObject) -> bool:
        """Selectors only (the namespace is already implied by the key range)."""
        if self.shard is not None and not in_shard(self.shard, obj):
            return False
        if not self.labels.empty and not self.labels.matches(obj.labels):
            return False
        return self.fields.empty or self.fields.matches(obj.fields)

    def exact_name(self) -> str | None:
        return self.fields.exact_value("metadata.name")

    def exact_field(self, field: str | None) -> str | None:
        return self.fields.exact_value(field) if field else None
