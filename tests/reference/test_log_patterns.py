"""What the control-plane tier counts in the components' logs (``harness/kube/controlplane.py``): no kit needed."""

from __future__ import annotations

from harness.kube.controlplane import matches

# kube-controller-manager v1.36's lines (the resource is not named) once a CRD it discovered was deleted.
GONE = (
    'E1129 10:18:38.871352 11923 reflector.go:227] "Failed to watch" err="failed to list *v1.PartialObjectMetadata: '
    'the server could not find the requested resource" logger="UnhandledError" '
    'reflector="k8s.io/client-go@v1.36.2/tools/cache/reflector.go:343" type="*v1.PartialObjectMetadata"'
)
SHORT = (
    'I1129 10:18:37.454916 11923 reflector.go:664] "Warning: watch ended with error" '
    'reflector="k8s.io/client-go@v1.36.2/tools/cache/reflector.go:343" type="*v1.PartialObjectMetadata" '
    'err="very short watch: k8s.io/client-go@v1.36.2/tools/cache/reflector.go:343: Unexpected watch close - '
    'watch lasted less than a second and no items received"'
)


def test_a_deleted_crds_metadata_informer_errors_count_only_when_no_crd_vanished() -> None:
    for line in (GONE, SHORT):
        assert matches("watch errors", line)
        assert not matches("watch errors", line, crd_vanished=True)


def test_other_watch_errors_count_even_when_a_crd_vanished() -> None:
    typed = GONE.replace("*v1.PartialObjectMetadata", "*v1.Pod")
    assert matches("watch errors", typed, crd_vanished=True)
    unauthorized = GONE.replace("the server could not find the requested resource", "Unauthorized")
    assert matches("watch errors", unauthorized, crd_vanished=True)
    assert matches("watch errors", 'W1129 reflector.go:561] "Warning: watch ended with error" err="EOF"', True)
    assert not matches("watch errors", 'I1129 reflector.go:376] "Caches populated"', True)
