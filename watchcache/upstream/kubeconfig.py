"""Kubeconfig as client-go loads it (``clientcmd``): which files, how they merge, what a context resolves to.

Loading rules (``ClientConfigLoadingRules`` then ``DeferredLoadingClientConfig``):

1. ``--kubeconfig FILE``: that file alone; it must exist.
2. else ``KUBECONFIG``: a ``:``-separated list of files, merged; a missing file is skipped.
3. else ``~/.kube/config`` if it exists.
4. else, when nothing was found and this is a pod (``KUBERNETES_SERVICE_HOST``/``_PORT`` and the
   service account's token are there): the in-cluster configuration.

Merging is kubectl's: the first file to name a cluster, user or context wins that name whole, and
the first file to set ``current-context`` wins it. Relative paths in a file (certificates, keys,
token files, an exec plugin's command if it has a ``/``) are relative to that file. ``--context``
replaces ``current-context``.

Everything a kubeconfig can say is either honoured or refused here, with the field's name, before
anything starts: never silently ignored (an ignored ``proxy-url`` connects direct, an ignored
``username`` runs as ``system:anonymous``).

Why not a library's loader (``kubernetes``' or ``kubernetes_asyncio``'s): docs/design-history.md,
"Kubeconfig". This module reads YAML and resolves names; what the fields mean at run time lives in
``upstream.config`` (TLS, proxy) and ``upstream.credentials`` (tokens, exec plugins).
"""

from __future__ import annotations

import base64
import binascii
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from watchcache.upstream.config import (
    EXEC_API_VERSIONS,
    INTERACTIVE_MODES,
    SERVICE_ACCOUNT_DIR,
    ExecConfig,
    UpstreamConfig,
    UpstreamConfigError,
    from_flags,
    in_cluster,
    in_cluster_possible,
)

# Fields client-go reads; anything else in a cluster, user or context is a typo or a newer field.
_CLUSTER_FIELDS = frozenset(
    {
        "server",
        "tls-server-name",
        "insecure-skip-tls-verify",
        "certificate-authority",
        "certificate-authority-data",
        "proxy-url",
        "disable-compression",
        "extensions",
    }
)
_USER_FIELDS = frozenset(
    {
        "client-certificate",
        "client-certificate-data",
        "client-key",
        "client-key-data",
        "token",
        "tokenFile",
        "as",
        "as-uid",
        "as-groups",
        "as-user-extra",
        "username",
        "password",
        "auth-provider",
        "exec",
        "extensions",
    }
)
_EXEC_FIELDS = frozenset(
    {"command", "args", "env", "apiVersion", "installHint", "provideClusterInfo", "interactiveMode"}
)
_PROXY_SCHEMES = ("http", "https", "socks5")
# The extension a cluster passes to its exec plugin as spec.cluster.config (provideClusterInfo).
EXEC_EXTENSION = "client.authentication.k8s.io/exec"


class NoKubeconfig(UpstreamConfigError):
    """Nothing to load: no file by any rule, and not in a pod."""


@dataclass(frozen=True)
class Loaded:
    """A merged kubeconfig: the document and, per cluster/user name, the file it came from."""

    doc: dict[str, Any]
    files: tuple[Path, ...]


def kubeconfig_files(explicit: str | None, env: Mapping[str, str], home: Path) -> list[Path]:
    """The files the rules name, in precedence order (existing ones only, but an explicit one must exist)."""
    if explicit:
        path = Path(explicit).expanduser()
        if not path.exists():
            raise UpstreamConfigError(f"--kubeconfig {explicit}: no such file")
        return [path]
    listed = env.get("KUBECONFIG", "")
    if listed:
        seen: list[Path] = []
        for entry in listed.split(os.pathsep):
            if not entry:
                continue
            path = Path(entry).expanduser()
            if path not in seen and path.exists():
                seen.append(path)
        return seen
    default = home / ".kube" / "config"
    return [default] if default.exists() else []


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise UpstreamConfigError(f"cannot read kubeconfig {path}: {e}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise UpstreamConfigError(f"kubeconfig {path} is not a mapping")
    return doc


def _resolved(entry: dict[str, Any], keys: tuple[str, ...], base: Path) -> dict[str, Any]:
    """``entry`` with its relative file paths made absolute against ``base`` (clientcmd's ResolvePaths)."""
    out = dict(entry)
    for key in keys:
        value = out.get(key)
        if isinstance(value, str) and value:
            p = Path(value).expanduser()
            out[key] = str(p if p.is_absolute() else base / p)
    return out


def merge(files: list[Path]) -> Loaded:
    """kubectl's merge: per name, the first file to define it wins; the first ``current-context`` wins."""
    doc: dict[str, Any] = {"clusters": {}, "users": {}, "contexts": {}}
    current: str | None = None
    for path in files:
        one = _read(path)
        base = path.absolute().parent  # as Go's filepath.Abs: symlinks not resolved
        if current is None and one.get("current-context"):
            current = str(one["current-context"])
        for section, inner, paths in (
            ("clusters", "cluster", ("certificate-authority",)),
            ("users", "user", ("client-certificate", "client-key", "tokenFile")),
            ("contexts", "context", ()),
        ):
            entries = one.get(section) or []
            if not isinstance(entries, list):
                raise UpstreamConfigError(f"kubeconfig {path}: {section} is not a list")
            for entry in entries:
                if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                    raise UpstreamConfigError(f"kubeconfig {path}: an entry of {section} has no name")
                name = entry["name"]
                if name in doc[section]:
                    continue
                body = entry.get(inner) or {}
                if not isinstance(body, dict):
                    raise UpstreamConfigError(f"kubeconfig {path}: {section} {name!r} is not a mapping")
                body = _resolved(body, paths, base)
                if section == "users" and isinstance(body.get("exec"), dict):
                    command = body["exec"].get("command")
                    if isinstance(command, str) and os.sep in command:
                        body["exec"] = _resolved(body["exec"], ("command",), base)
                doc[section][name] = (body, path)
    doc["current-context"] = current
    return Loaded(doc, tuple(files))


def _b64(value: Any, what: str) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        raise UpstreamConfigError(f"kubeconfig {what} is not base64") from None


def _file_bytes(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise UpstreamConfigError(f"kubeconfig {what} {path}: {e.strerror}") from None


def _unknown(body: Mapping[str, Any], known: frozenset[str], where: str) -> None:
    extra = sorted(set(body) - known)
    if extra:
        raise UpstreamConfigError(f"{where}: unknown field(s) {', '.join(extra)}")


def _exec_config(spec: Any, where: str, cluster_info: dict[str, Any]) -> ExecConfig:
    """client-go's exec validation (clientcmd validateAuthInfo and the exec authenticator's own)."""
    if not isinstance(spec, dict):
        raise UpstreamConfigError(f"{where}: exec is not a mapping")
    _unknown(spec, _EXEC_FIELDS, f"{where}.exec")
    command = spec.get("command")
    if not command or not isinstance(command, str):
        raise UpstreamConfigError(f"{where}: exec.command is required")
    version = spec.get("apiVersion")
    if version not in EXEC_API_VERSIONS:
        raise UpstreamConfigError(
            f"{where}: exec.apiVersion {version!r} is not supported (one of {', '.join(EXEC_API_VERSIONS)})"
        )
    mode = spec.get("interactiveMode")
    if mode is None:
        if version == "client.authentication.k8s.io/v1":
            raise UpstreamConfigError(
                f"{where}: exec.interactiveMode must be set with {version} (Never, IfAvailable or Always)"
            )
        mode = "IfAvailable"
    if mode not in INTERACTIVE_MODES:
        raise UpstreamConfigError(
            f"{where}: exec.interactiveMode {mode!r} is not one of {', '.join(INTERACTIVE_MODES)}"
        )
    if mode == "Always" and not (sys.stdin is not None and sys.stdin.isatty()):
        raise UpstreamConfigError(
            f"{where}: exec.interactiveMode is Always, but standard input is not a terminal (watchcache runs as a "
            "service): set it to Never or IfAvailable, or give watchcache another credential"
        )
    env: list[tuple[str, str]] = []
    for item in spec.get("env") or []:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise UpstreamConfigError(f"{where}: exec.env entries need a name and a value")
        env.append((item["name"], str(item.get("value", ""))))
    args = spec.get("args") or []
    if not isinstance(args, list):
        raise UpstreamConfigError(f"{where}: exec.args is not a list")
    if shutil.which(command) is None:
        hint = spec.get("installHint") or ""
        raise UpstreamConfigError(
            f"{where}: exec plugin {command!r} not found (not executable, or not on PATH). It is a client-go "
            "credential plugin; install it"
            + (
                f":\n{hint}"
                if hint
                else " (https://kubernetes.io/docs/reference/access-authn-authz/authentication/#client-go-credential-plugins)"
            )
        )
    return ExecConfig(
        command=command,
        args=tuple(str(a) for a in args),
        env=tuple(env),
        api_version=str(version),
        interactive_mode=str(mode),
        install_hint=str(spec.get("installHint") or ""),
        cluster=cluster_info if spec.get("provideClusterInfo") else None,
    )


def _server(cluster: dict[str, Any], where: str, tls_configured: bool) -> str:
    server = cluster.get("server")
    if not server or not isinstance(server, str):
        raise UpstreamConfigError(f"{where} has no server")
    if "://" not in server:
        # client-go's DefaultServerURL: a bare host is https when TLS is configured, else http.
        server = ("https://" if tls_configured else "http://") + server
    scheme = server.split("://", 1)[0]
    if scheme not in ("http", "https"):
        raise UpstreamConfigError(f"{where}: server {server!r} is not an http(s) URL")
    return server.rstrip("/")


def _proxy_url(value: Any, where: str) -> str | None:
    if value in (None, ""):
        return None
    text = str(value)
    scheme = text.split("://", 1)[0] if "://" in text else ""
    if scheme not in _PROXY_SCHEMES:
        raise UpstreamConfigError(
            f"{where}: proxy-url {text!r} has scheme {scheme or '(none)'!r}; client-go supports "
            f"{', '.join(_PROXY_SCHEMES)}"
        )
    return text


def resolve(loaded: Loaded, context: str | None = None) -> UpstreamConfig:
    """The upstream a merged kubeconfig's context names, or a clear error for what cannot work."""
    doc = loaded.doc
    where_files = ", ".join(str(f) for f in loaded.files)
    name = context or doc.get("current-context")
    if not name:
        raise UpstreamConfigError(f"kubeconfig ({where_files}) has no current-context; pass --context")
    if name not in doc["contexts"]:
        raise UpstreamConfigError(f"kubeconfig ({where_files}) has no context named {name!r}")
    ctx, _ = doc["contexts"][name]
    cluster_name = ctx.get("cluster")
    if not cluster_name or cluster_name not in doc["clusters"]:
        raise UpstreamConfigError(f"context {name!r}: no cluster named {cluster_name!r}")
    cluster, cluster_file = doc["clusters"][cluster_name]
    where_cluster = f"cluster {cluster_name!r} ({cluster_file})"
    _unknown(cluster, _CLUSTER_FIELDS, where_cluster)
    user: dict[str, Any] = {}
    user_name = ctx.get("user")
    where_user = "context has no user"
    if user_name:
        if user_name not in doc["users"]:
            raise UpstreamConfigError(f"context {name!r}: no user named {user_name!r}")
        user, user_file = doc["users"][user_name]
        where_user = f"user {user_name!r} ({user_file})"
        _unknown(user, _USER_FIELDS, where_user)
    if user.get("auth-provider"):
        provider = (user["auth-provider"] or {}).get("name", "?")
        raise UpstreamConfigError(
            f"{where_user}: auth-provider {provider!r} is not supported (client-go removed the gcp and azure "
            "providers in 1.26): use its exec plugin instead (gke-gcloud-auth-plugin, kubelogin, "
            "aws eks get-token), or a token or client certificate"
        )
    impersonating = [k for k in ("as", "as-uid", "as-groups", "as-user-extra") if user.get(k)]
    if impersonating:
        raise UpstreamConfigError(
            f"{where_user}: impersonation ({', '.join(impersonating)}) is not supported for watchcache's own "
            "identity: give it a credential of its own (a ServiceAccount token, a client certificate, or an exec "
            "plugin) with the RBAC in docs/deploy.md"
        )
    token_methods = bool(user.get("token") or user.get("tokenFile"))
    basic = bool(user.get("username") or user.get("password"))
    if token_methods and basic:
        raise UpstreamConfigError(
            f"{where_user}: more than one authentication method found (token and basicAuth); only one is allowed"
        )
    if basic and not (user.get("username") and user.get("password")):
        raise UpstreamConfigError(f"{where_user}: username and password go together")

    # *-data fields stay in memory; file references stay paths (read at start, so a missing one is an
    # error now, and again by ssl when a context is made: a rotated file is picked up as client-go does).
    ca_data: bytes | None = None
    ca_bytes = b""
    ca_file = cluster.get("certificate-authority") or None
    if cluster.get("certificate-authority-data"):
        ca_data = _b64(cluster["certificate-authority-data"], f"{where_cluster} certificate-authority-data")
        ca_file = None
    elif ca_file:
        ca_bytes = _file_bytes(ca_file, f"{where_cluster} certificate-authority")
    cert = key = None
    cert_file = user.get("client-certificate") or None
    key_file = user.get("client-key") or None
    if user.get("client-certificate-data"):
        cert = _b64(user["client-certificate-data"], f"{where_user} client-certificate-data")
        cert_file = None
    elif cert_file:
        _file_bytes(cert_file, f"{where_user} client-certificate")
    if user.get("client-key-data"):
        key = _b64(user["client-key-data"], f"{where_user} client-key-data")
        key_file = None
    elif key_file:
        _file_bytes(key_file, f"{where_user} client-key")
    if bool(cert or cert_file) != bool(key or key_file):
        raise UpstreamConfigError(f"{where_user}: a client certificate needs its key, and a key its certificate")
    if bool(cert) != bool(key):
        # One inline, the other a file: ssl wants both the same way; read the file.
        if cert_file:
            cert, cert_file = _file_bytes(cert_file, f"{where_user} client-certificate"), None
        if key_file:
            key, key_file = _file_bytes(key_file, f"{where_user} client-key"), None
    insecure = bool(cluster.get("insecure-skip-tls-verify"))
    if insecure and (ca_data or ca_file):
        raise UpstreamConfigError(
            f"{where_cluster}: certificate-authority and insecure-skip-tls-verify cannot both be set "
            "(client-go refuses it)"
        )
    server = _server(cluster, where_cluster, bool(ca_data or ca_file or cert or cert_file or insecure))
    proxy_url = _proxy_url(cluster.get("proxy-url"), where_cluster)
    tls_server_name = cluster.get("tls-server-name") or None
    exec_config = None
    if user.get("exec"):
        info: dict[str, Any] = {"server": server}
        if tls_server_name:
            info["tls-server-name"] = tls_server_name
        if insecure:
            info["insecure-skip-tls-verify"] = True
        if ca_data or ca_file:
            pem = ca_data if ca_data else ca_bytes
            info["certificate-authority-data"] = base64.b64encode(pem).decode()
        if proxy_url:
            info["proxy-url"] = proxy_url
        if cluster.get("disable-compression"):
            info["disable-compression"] = True
        for ext in cluster.get("extensions") or []:
            if isinstance(ext, dict) and ext.get("name") == EXEC_EXTENSION:
                info["config"] = ext.get("extension")
        exec_config = _exec_config(user["exec"], where_user, info)
    return UpstreamConfig(
        server=server,
        ca_file=ca_file,
        ca_data=ca_data.decode("latin-1") if ca_data else None,
        insecure=insecure,
        client_cert=cert_file,
        client_key=key_file,
        client_cert_data=cert,
        client_key_data=key,
        token=str(user["token"]) if user.get("token") else None,
        token_file=user.get("tokenFile") or None,
        username=str(user["username"]) if basic else None,
        password=str(user["password"]) if basic else None,
        tls_server_name=tls_server_name,
        proxy_url=proxy_url,
        exec=exec_config,
        disable_compression=bool(cluster.get("disable-compression")),
        source=f"kubeconfig {where_files}, context {name!r}",
    )


def from_kubeconfig(path: str | os.PathLike[str], context: str | None = None) -> UpstreamConfig:
    """One kubeconfig file, as ``--kubeconfig`` loads it."""
    return load(str(path), context)


def load(
    explicit: str | None = None,
    context: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    home: Path | None = None,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> UpstreamConfig:
    """The upstream the loading rules find (see the module docstring); NoKubeconfig if there is none."""
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    files = kubeconfig_files(explicit, env, home)
    if files:
        return resolve(merge(files), context)
    if context is None and in_cluster_possible(env, service_account_dir):
        return in_cluster(env, service_account_dir)
    listed = env.get("KUBECONFIG")
    looked = (
        f"KUBECONFIG={listed} (no such file)" if listed else f"KUBECONFIG is unset, {home}/.kube/config does not exist"
    )
    raise NoKubeconfig(
        f"no upstream apiserver found: no --kubeconfig, {looked}, and this is not a pod "
        "(KUBERNETES_SERVICE_HOST unset or no service-account token). Point watchcache at an apiserver "
        "(--kubeconfig FILE, --upstream URL, --in-cluster), or run the simulated cluster explicitly "
        "(watchcache demo, or watchcache serve --simulated)"
    )


@dataclass(frozen=True)
class UpstreamFlags:
    """The flags of ``watchcache serve`` that name its apiserver, as values (the command line reads them)."""

    upstream: str | None = None
    kubeconfig: str | None = None
    context: str | None = None
    in_cluster: bool = False
    simulated: bool = False
    # Only with --upstream URL: a kubeconfig and the in-cluster configuration name their own credentials.
    token_file: str | None = None
    client_certificate: str | None = None
    client_key: str | None = None
    certificate_authority: str | None = None
    insecure_skip_tls_verify: bool = False

    def url_only_flags(self) -> list[str]:
        given = (
            ("--token-file", self.token_file),
            ("--client-certificate", self.client_certificate),
            ("--client-key", self.client_key),
            ("--certificate-authority", self.certificate_authority),
            ("--insecure-skip-tls-verify", self.insecure_skip_tls_verify),
        )
        return [flag for flag, value in given if value]


def upstream_from_flags(flags: UpstreamFlags) -> UpstreamConfig | None:
    """The apiserver ``watchcache serve``'s flags name, by client-go's loading rules when no flag names one;
    None only for ``--simulated`` (the embedded simulated cluster, an explicit choice)."""
    explicit = [f for f, on in (("--upstream", flags.upstream), ("--in-cluster", flags.in_cluster)) if on]
    if flags.kubeconfig:
        explicit.append("--kubeconfig")
    if flags.simulated:
        explicit.append("--simulated")
    if len(explicit) > 1:
        raise UpstreamConfigError(f"{' and '.join(explicit)} name different upstreams: choose one")
    if flags.context and explicit and explicit[0] != "--kubeconfig":
        raise UpstreamConfigError(f"--context selects a kubeconfig context; it does not apply to {explicit[0]}")
    url_flags = flags.url_only_flags()
    if url_flags and not flags.upstream:
        raise UpstreamConfigError(
            f"{', '.join(url_flags)} apply to --upstream URL; a kubeconfig or the in-cluster configuration names "
            "its own credentials"
        )
    if flags.simulated:
        return None
    if flags.upstream:
        return from_flags(
            flags.upstream,
            token_file=flags.token_file,
            client_certificate=flags.client_certificate,
            client_key=flags.client_key,
            certificate_authority=flags.certificate_authority,
            insecure_skip_tls_verify=flags.insecure_skip_tls_verify,
        )
    if flags.in_cluster:
        return in_cluster()
    return load(flags.kubeconfig, flags.context)
