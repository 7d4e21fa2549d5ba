"""The simulated cluster's users and permissions: a static YAML policy with RBAC semantics.

```yaml
users:                      # who can authenticate (TokenReview)
- name: alice
  token: alice-token        # optional: a user may exist only to be bound (e.g. a certificate's CN)
  uid: uid-alice            # optional
  groups: [readers]         # optional; TokenReview adds system:authenticated
  extra: {scopes: [a, b]}   # optional
bindings:                   # who may do what (SubjectAccessReview)
- name: alice-reads         # optional, shown in the allow reason
  users: [alice]            # users and/or groups
  groups: []
  rules:
  - apiGroups: [""]         # "" is the core group, "*" every group
    resources: [pods, configmaps]   # "*" every resource, "pods/log" a subresource, "*/status"
    verbs: [get, list, watch]       # "*" every verb
    namespaces: [ns-1]      # optional: only in these namespaces (a RoleBinding); absent = everywhere,
                            # cluster-scoped requests included (a ClusterRoleBinding)
    resourceNames: [cm-1]   # optional: only these objects
  - nonResourceURLs: [/version, /apis/*]   # non-resource paths; a trailing * is a prefix match
    verbs: [get]
```

Matching is RBAC's (``k8s.io/kubernetes/pkg/apis/rbac/v1/evaluation_helpers.go``): a rule
allows a request when its verbs, apiGroups, resources (``resource/subresource``) and
resourceNames all match. A rule with ``resourceNames`` never matches a request without a
name, so it grants ``get`` of those objects and ``list``/``watch`` only when the request
names one (kube's RequestInfo names a list/watch whose ``fieldSelector`` is
``metadata.name=X``); never ``create``. Nothing is denied explicitly: what no rule allows is
not allowed, with an empty reason (RBAC's "no opinion").
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["Binding", "Policy", "PolicyError", "PolicyUser", "Rule", "load_policy"]


class PolicyError(ValueError):
    """The policy file is unreadable or invalid; the message names the file and the field."""


@dataclass(frozen=True)
class PolicyUser:
    name: str
    token: str | None = field(default=None, repr=False)
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Rule:
    verbs: tuple[str, ...]
    api_groups: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    resource_names: tuple[str, ...] = ()
    # None: every namespace and the cluster scope; else only requests in one of these namespaces.
    namespaces: tuple[str, ...] | None = None
    non_resource_urls: tuple[str, ...] = ()

    def _verb(self, verb: str) -> bool:
        return "*" in self.verbs or verb in self.verbs

    def _resource(self, resource: str, subresource: str) -> bool:
        combined = f"{resource}/{subresource}" if subresource else resource
        for rule_resource in self.resources:
            if rule_resource in ("*", combined):
                return True
            if subresource and rule_resource == f"*/{subresource}":
                return True
        return False

    def allows(self, verb: str, group: str, resource: str, subresource: str, namespace: str, name: str) -> bool:
        if self.namespaces is not None and namespace not in self.namespaces:
            return False
        return (
            self._verb(verb)
            and ("*" in self.api_groups or group in self.api_groups)
            and self._resource(resource, subresource)
            and (not self.resource_names or name in self.resource_names)
        )

    def allows_non_resource(self, verb: str, path: str) -> bool:
        if not self._verb(verb):
            return False
        for url in self.non_resource_urls:
            if url in ("*", path):
                return True
            if url.endswith("*") and path.startswith(url.rstrip("*")):
                return True
        return False


@dataclass(frozen=True)
class Binding:
    name: str
    rules: tuple[Rule, ...]
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()

    def subject(self, user: str, groups: Iterable[str]) -> str | None:
        """How the binding applies to this user (``User "x"`` / ``Group "g"``), None if it does not."""
        if user in self.users:
            return f'User "{user}"'
        for group in groups:
            if group in self.groups:
                return f'Group "{group}"'
        return None


def _token_key(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class Policy:
    def __init__(self, users: Iterable[PolicyUser] = (), bindings: Iterable[Binding] = ()) -> None:
        self.users = tuple(users)
        self.bindings = tuple(bindings)
        self._by_token = {_token_key(u.token): u for u in self.users if u.token}

    @classmethod
    def from_yaml(cls, text: str, source: str = "<policy>") -> Policy:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise PolicyError(f"{source}: not valid YAML: {e}") from None
        return cls.from_dict(data, source)

    @classmethod
    def from_dict(cls, data: Any, source: str = "<policy>") -> Policy:
        return _Loader(source).policy(data)

    def authenticate(self, token: str) -> PolicyUser | None:
        """The user this bearer token belongs to, None for an unknown token."""
        if not token:
            return None
        return self._by_token.get(_token_key(token))

    def authorize(
        self,
        user: str,
        groups: Iterable[str],
        verb: str,
        group: str,
        resource: str,
        namespace: str = "",
        name: str = "",
        subresource: str = "",
    ) -> tuple[bool, str]:
        """(allowed, reason) for a resource request, as RBAC decides it."""
        groups = tuple(groups)
        for binding in self.bindings:
            subject = binding.subject(user, groups)
            if subject is None:
                continue
            for i, rule in enumerate(binding.rules):
                if rule.allows(verb, group, resource, subresource, namespace, name):
                    return True, f'policy: allowed by binding "{binding.name}" rule {i} to {subject}'
        return False, ""

    def authorize_non_resource(self, user: str, groups: Iterable[str], verb: str, path: str) -> tuple[bool, str]:
        """(allowed, reason) for a non-resource request (``/version``, ``/apis``...)."""
        groups = tuple(groups)
        for binding in self.bindings:
            subject = binding.subject(user, groups)
            if subject is None:
                continue
            for i, rule in enumerate(binding.rules):
                if rule.allows_non_resource(verb, path):
                    return True, f'policy: allowed by binding "{binding.name}" rule {i} to {subject}'
        return False, ""


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy file; PolicyError (naming the file and field) when it is not one."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise PolicyError(f"{path}: cannot read the policy file: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise PolicyError(f"{path}: the policy file is not UTF-8 text") from None
    return Policy.from_yaml(text, str(path))


_USER_FIELDS = ("name", "token", "uid", "groups", "extra")
_BINDING_FIELDS = ("name", "users", "groups", "rules")
_RULE_FIELDS = ("apiGroups", "resources", "verbs", "namespaces", "resourceNames", "nonResourceURLs")


class _Loader:
    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, where: str, message: str) -> PolicyError:
        return PolicyError(f"{self.source}: {where}: {message}" if where else f"{self.source}: {message}")

    def mapping(self, value: Any, where: str, allowed: tuple[str, ...]) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise self.error(where, f"must be a mapping, not {_type(value)}")
        for key in value:
            if key not in allowed:
                raise self.error(where, f"unknown field {key!r} (expected one of: {', '.join(allowed)})")
        return value

    def string(self, value: Any, where: str, *, empty: bool = False) -> str:
        if not isinstance(value, str):
            raise self.error(where, f"must be a string, not {_type(value)}")
        if not value and not empty:
            raise self.error(where, "must not be empty")
        return value

    def strings(self, value: Any, where: str, *, required: bool = False, empty_items: bool = False) -> tuple[str, ...]:
        if value is None:
            if required:
                raise self.error(where, "is required")
            return ()
        if not isinstance(value, list):
            raise self.error(where, f"must be a list of strings, not {_type(value)}")
        if required and not value:
            raise self.error(where, "must not be empty")
        return tuple(self.string(v, f"{where}[{i}]", empty=empty_items) for i, v in enumerate(value))

    def policy(self, data: Any) -> Policy:
        if data is None:
            raise self.error("", "the policy is empty (expected 'users' and 'bindings')")
        root = self.mapping(data, "", ("users", "bindings"))
        users = self.list_of(root.get("users"), "users")
        bindings = self.list_of(root.get("bindings"), "bindings")
        parsed_users: list[PolicyUser] = []
        names: dict[str, int] = {}
        tokens: dict[str, int] = {}
        for i, raw in enumerate(users):
            user = self.user(raw, f"users[{i}]")
            if user.name in names:
                raise self.error(f"users[{i}].name", f"{user.name!r} is already users[{names[user.name]}]")
            names[user.name] = i
            if user.token is not None:
                if user.token in tokens:  # the message never shows the token
                    raise self.error(f"users[{i}].token", f"the same token as users[{tokens[user.token]}]")
                tokens[user.token] = i
            parsed_users.append(user)
        parsed_bindings = [self.binding(raw, f"bindings[{i}]", i) for i, raw in enumerate(bindings)]
        return Policy(parsed_users, parsed_bindings)

    def list_of(self, value: Any, where: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.error(where, f"must be a list, not {_type(value)}")
        return value

    def user(self, raw: Any, where: str) -> PolicyUser:
        m = self.mapping(raw, where, _USER_FIELDS)
        if "name" not in m:
            raise self.error(f"{where}.name", "is required")
        name = self.string(m["name"], f"{where}.name")
        token = self.string(m["token"], f"{where}.token") if m.get("token") is not None else None
        if token is not None and (token != token.strip() or " " in token):
            raise self.error(f"{where}.token", "must not contain spaces")
        uid = self.string(m["uid"], f"{where}.uid") if m.get("uid") is not None else ""
        groups = self.strings(m.get("groups"), f"{where}.groups")
        extra: dict[str, tuple[str, ...]] = {}
        if m.get("extra") is not None:
            raw_extra = m["extra"]
            if not isinstance(raw_extra, dict):
                raise self.error(f"{where}.extra", f"must be a mapping of lists of strings, not {_type(raw_extra)}")
            for key, values in raw_extra.items():
                key = self.string(key, f"{where}.extra")
                extra[key] = self.strings(values, f"{where}.extra.{key}", required=True)
        return PolicyUser(name, token, uid, groups, extra)

    def binding(self, raw: Any, where: str, index: int) -> Binding:
        m = self.mapping(raw, where, _BINDING_FIELDS)
        name = self.string(m["name"], f"{where}.name") if m.get("name") is not None else f"binding-{index}"
        users = self.strings(m.get("users"), f"{where}.users")
        groups = self.strings(m.get("groups"), f"{where}.groups")
        if not users and not groups:
            raise self.error(where, "binds nobody: give 'users' and/or 'groups'")
        rules = m.get("rules")
        if not isinstance(rules, list) or not rules:
            raise self.error(f"{where}.rules", "must be a non-empty list of rules")
        return Binding(name, tuple(self.rule(r, f"{where}.rules[{i}]") for i, r in enumerate(rules)), users, groups)

    def rule(self, raw: Any, where: str) -> Rule:
        m = self.mapping(raw, where, _RULE_FIELDS)
        verbs = self.strings(m.get("verbs"), f"{where}.verbs", required=True)
        urls = self.strings(m.get("nonResourceURLs"), f"{where}.nonResourceURLs")
        if urls:
            for key in ("apiGroups", "resources", "resourceNames", "namespaces"):
                if m.get(key) is not None:
                    raise self.error(where, f"a rule with nonResourceURLs cannot have {key} (as in RBAC)")
            for i, url in enumerate(urls):
                if url != "*" and not url.startswith("/"):
                    raise self.error(f"{where}.nonResourceURLs[{i}]", f"{url!r} must start with '/' (or be '*')")
            return Rule(verbs, non_resource_urls=urls)
        if m.get("resources") is None:
            raise self.error(where, "needs 'resources' (with 'apiGroups') or 'nonResourceURLs'")
        resources = self.strings(m.get("resources"), f"{where}.resources", required=True)
        api_groups = self.strings(m.get("apiGroups"), f"{where}.apiGroups", required=True, empty_items=True)
        names = self.strings(m.get("resourceNames"), f"{where}.resourceNames")
        namespaces = None
        if m.get("namespaces") is not None:
            namespaces = self.strings(m["namespaces"], f"{where}.namespaces", required=True)
        return Rule(verbs, api_groups, resources, names, namespaces)


def _type(value: Any) -> str:
    if value is None:
        return "null"
    names = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)
