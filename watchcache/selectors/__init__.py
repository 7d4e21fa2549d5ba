"""Kubernetes label and field selectors with apimachinery's syntax, semantics and errors."""

from watchcache.selectors.errors import SelectorError, UnsupportedFieldError
from watchcache.selectors.fields import (
    FieldRequirement,
    FieldSelector,
    escape_field_value,
    parse_field_selector,
    unescape_field_value,
)
from watchcache.selectors.labels import LabelRequirement, LabelSelector, Operator, parse_label_selector

__all__ = [
    "FieldRequirement",
    "FieldSelector",
    "LabelRequirement",
    "LabelSelector",
    "Operator",
    "SelectorError",
    "UnsupportedFieldError",
    "escape_field_value",
    "parse_field_selector",
    "parse_label_selector",
    "unescape_field_value",
]
