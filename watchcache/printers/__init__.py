"""kube-apiserver's Tables (``kubectl get``'s output), printed from cached objects.

``kube.py`` ports the printers of kube's own kinds, ``crd.py`` a custom resource's printer
columns (with ``jsonpath.py``, client-go's JSONPath), ``row.py`` keeps each object's row, derived
once, and ``table.py`` writes Tables for GET, LIST and WATCH. No I/O and no clock: the time a
Table's ages are relative to is injected.
"""
