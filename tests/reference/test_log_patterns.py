"""What the control-plane tier counts in the components' logs (``harness/kube/controlplane.py``): no kit needed."""

from __future__ import annotations

from harness.kube.controlplane import matches

GONE_CRD = (
    'E1129 08:30:01.1 1 reflector.go:200] "Failed to watch" err="failed to list *v1.PartialObjectMetadata: '
    'the server could not find the requested resource (get things.gw1.diff.reference.example.com)"'
)


def test_a_404_on_the_tiers_own_deleted_crd_is_not_a_watch_error_but_every_other_is() -> None:
    assert not matches("watch errors", GONE_CRD)
    assert matches("watch errors", GONE_CRD.replace("things.gw1.diff.reference.example.com", "pods"))
    assert matches("watch errors", GONE_CRD.replace("the server could not find the requested resource", "Unauthorized"))
    assert matches("watch errors", "W1129 reflector.go:561] Warning: watch ended with error: EOF")
    assert not matches("watch errors", 'I1129 reflector.go:376] "Caches populated"')
