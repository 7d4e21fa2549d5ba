"""``pods/log`` of the simulated cluster: kube-apiserver's answer when no kubelet can be reached.

kube-apiserver serves a pod's log by asking the kubelet of the pod's node
(``pod.LogLocation``): it validates the container, answers ``204 No Content`` for a pod
not yet bound to a node, and otherwise dials ``https://<node>:10250/containerLogs/...``.
The simulated cluster has no kubelets, so every bound pod gets what a cluster whose
kubelet is down answers — a ``500`` Status with no reason whose message is the failed
``Get`` (kube-apiserver v1.36, for a Node whose kubelet it cannot reach: ``Get
"https://NODE:PORT/containerLogs/NS/POD/CONTAINER": dial tcp: lookup NODE ...: no such
host``) — with a message that says why, instead of a ``405`` that suggests kubectl asked
for something wrong.
"""

from __future__ import annotations

from typing import Any

from watchcache import apierrors
from watchcache.sim.streams import container_name

# kube-apiserver's --kubelet-preferred-address-types default, and the kubelet's port.
_ADDRESS_TYPES = ("Hostname", "InternalDNS", "InternalIP", "ExternalDNS", "ExternalIP")
_KUBELET_PORT = 10250


def kubelet_host(node: dict[str, Any] | None, node_name: str) -> str:
    """The address kube-apiserver would dial for the node's kubelet (``host:port``)."""
    status = (node or {}).get("status") or {}
    addresses = {a.get("type"): a.get("address") for a in status.get("addresses") or []}
    host = next((addresses[t] for t in _ADDRESS_TYPES if addresses.get(t)), node_name)
    port = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port") or _KUBELET_PORT
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def answer(pod: dict[str, Any], container: str | None, node: dict[str, Any] | None) -> int:
    """204 for a pod on no node (kube's empty stream); else the Status a kubelet-less cluster gives.

    ``node`` is the pod's Node object if the cluster has it. Raises the ``StatusError``.
    """
    chosen = container_name(pod, container)  # kube's validateContainer: 400 before anything else
    node_name = (pod.get("spec") or {}).get("nodeName") or ""
    if not node_name:
        return 204
    if node is None:
        raise apierrors.not_found("", "nodes", node_name)
    meta = pod.get("metadata") or {}
    url = f"https://{kubelet_host(node, node_name)}/containerLogs/{meta.get('namespace')}/{meta.get('name')}/{chosen}"
    raise apierrors.StatusError(
        500,
        "",  # StatusReasonUnknown: kube's answer to an error that is not a Status (here the dial's)
        f'Get "{url}": the simulated cluster has no kubelets: node "{node_name}" serves no container logs',
    )
