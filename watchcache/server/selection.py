"""A read's selectors (label, field, shard) parsed into its predicate, or the Status kube answers for them.

Shared by LIST (``server/reads.py``) and WATCH (``server/watch.py``), which do not import each other.
"""

from __future__ import annotations

from watchcache import apierrors
from watchcache.cache.predicate import SelectionPredicate, UnsupportedField
from watchcache.cache.semantics import ListOptions, validate_list_options
from watchcache.resources import ResourceType
from watchcache.selectors import SelectorError
from watchcache.selectors.shards import ShardSelectorError
from watchcache.server.negotiation import PassReason
from watchcache.server.refusals import PassThrough


def parse_predicate(resource: ResourceType, namespace: str, opts: ListOptions) -> SelectionPredicate:
    """The predicate of a LIST or watch; raises its 400 (or 500, as kube for a shard selector), or
    ``PassThrough`` for a field only the upstream may know (a CRD's selectableFields).

    Called before the read is planned: kube answers a selector's syntax before the options' 422, and
    both before a bad resourceVersion or continue token."""
    try:
        return SelectionPredicate.parse(
            resource, namespace, opts.label_selector, opts.field_selector, opts.shard_selector
        )
    except UnsupportedField as e:
        # kube converts field labels after it validates the options (422), and before it reads
        # the resourceVersion or continue token: so does this, whatever the caller plans next.
        validate_list_options(opts)
        if e.custom:  # perhaps one of the CRD's selectableFields: the upstream knows
            raise PassThrough(PassReason.FIELD_SELECTOR) from None
        raise apierrors.bad_request(str(e)) from None
    except ShardSelectorError as e:
        # kube's registry returns a plain error, which its handler writes as a 500 with no reason.
        raise apierrors.StatusError(500, "", f"invalid shard selector: {e}") from None
    except SelectorError as e:
        raise apierrors.bad_request(str(e)) from None
