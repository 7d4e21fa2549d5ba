"""The reference kube-apiserver kit (shared/tools/kube-reference) as the tests and the benchmarks drive it:
its environment and API (``kit``), a private apiserver and control plane of one's own (``private``,
``controlplane``), a request log between a client and it (``requestlog``), and the control-plane
differential both the reference tier and ``loadtest/bench/reference_control_plane`` run (``comparison``
over ``scenario``, ``crds``, ``kubelet``)."""
