# ruff: noqa: E501
"""What kube-apiserver's bookmark of a built-in kind carries after its metadata: the kind's zero values.

kube makes a bookmark as a new empty object of the kind with only its resourceVersion (and annotations)
set, and encodes it whole: every field without ``omitempty`` is written with its zero value (a Pod's
``"spec":{"containers":null},"status":{}``), which only the kind's Go type knows. These bytes are
kube-apiserver's, read off its own bookmarks by ``python -m harness.kube.zeros`` (which wrote this
file; the reference tier compares bookmarks with the live apiserver's). A kind or version not here
(a custom resource's, whose unstructured bookmark has none) gets a bookmark of metadata only.

The protobuf caches learn theirs from the upstream's bookmarks (``ProtobufEncoding.learn_empty``): a
protobuf client decodes a bookmark into its type, and a field left out is a different message. A JSON
cache would have to learn it in every worker, by a request per kind, for bytes no client reads.
"""

# (group, version, kind) -> what follows a bookmark's metadata, each field led by its comma.
# fmt: off
BOOKMARK_TAILS: dict[tuple[str, str, str], bytes] = {
    ("", "v1", "Event"): b',"involvedObject":{},"source":{},"firstTimestamp":null,"lastTimestamp":null,"eventTime":null,"reportingComponent":"","reportingInstance":""',
    ("", "v1", "LimitRange"): b',"spec":{"limits":null}',
    ("", "v1", "Namespace"): b',"spec":{},"status":{}',
    ("", "v1", "Node"): b',"spec":{},"status":{"daemonEndpoints":{"kubeletEndpoint":{"Port":0}},"nodeInfo":{"machineID":"","systemUUID":"","bootID":"","kernelVersion":"","osImage":"","containerRuntimeVersion":"","kubeletVersion":"","kubeProxyVersion":"","operatingSystem":"","architecture":""}}',
    ("", "v1", "PersistentVolume"): b',"spec":{},"status":{}',
    ("", "v1", "PersistentVolumeClaim"): b',"spec":{"resources":{}},"status":{}',
    ("", "v1", "Pod"): b',"spec":{"containers":null},"status":{}',
    ("", "v1", "PodTemplate"): b',"template":{"metadata":{},"spec":{"containers":null}}',
    ("", "v1", "ReplicationController"): b',"spec":{},"status":{"replicas":0}',
    ("", "v1", "ResourceQuota"): b',"spec":{},"status":{}',
    ("", "v1", "Service"): b',"spec":{},"status":{"loadBalancer":{}}',
    ("admissionregistration.k8s.io", "v1", "MutatingAdmissionPolicy"): b',"spec":{}',
    ("admissionregistration.k8s.io", "v1", "MutatingAdmissionPolicyBinding"): b',"spec":{}',
    ("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicy"): b',"spec":{},"status":{}',
    ("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicyBinding"): b',"spec":{}',
    ("apiextensions.k8s.io", "v1", "CustomResourceDefinition"): b',"spec":{"group":"","names":{"plural":"","kind":""},"scope":"","versions":null},"status":{"conditions":null,"acceptedNames":{"plural":"","kind":""},"storedVersions":null}',
    ("apiregistration.k8s.io", "v1", "APIService"): b',"spec":{"groupPriorityMinimum":0,"versionPriority":0},"status":{}',
    ("apps", "v1", "ControllerRevision"): b',"data":null,"revision":0',
    ("apps", "v1", "DaemonSet"): b',"spec":{"selector":null,"template":{"metadata":{},"spec":{"containers":null}},"updateStrategy":{}},"status":{"currentNumberScheduled":0,"numberMisscheduled":0,"desiredNumberScheduled":0,"numberReady":0}',
    ("apps", "v1", "Deployment"): b',"spec":{"replicas":0,"selector":null,"template":{"metadata":{},"spec":{"containers":null}},"strategy":{}},"status":{}',
    ("apps", "v1", "ReplicaSet"): b',"spec":{"replicas":0,"selector":null,"template":{"metadata":{},"spec":{"containers":null}}},"status":{"replicas":0}',
    ("apps", "v1", "StatefulSet"): b',"spec":{"replicas":0,"selector":null,"template":{"metadata":{},"spec":{"containers":null}},"serviceName":"","updateStrategy":{}},"status":{"replicas":0,"availableReplicas":0}',
    ("autoscaling", "v1", "HorizontalPodAutoscaler"): b',"spec":{"scaleTargetRef":{"kind":"","name":""},"maxReplicas":0},"status":{"currentReplicas":0,"desiredReplicas":0}',
    ("autoscaling", "v2", "HorizontalPodAutoscaler"): b',"spec":{"scaleTargetRef":{"kind":"","name":""},"maxReplicas":0},"status":{"desiredReplicas":0,"currentMetrics":null}',
    ("batch", "v1", "CronJob"): b',"spec":{"schedule":"","jobTemplate":{"metadata":{},"spec":{"template":{"metadata":{},"spec":{"containers":null}}}}},"status":{}',
    ("batch", "v1", "Job"): b',"spec":{"template":{"metadata":{},"spec":{"containers":null}}},"status":{}',
    ("certificates.k8s.io", "v1", "CertificateSigningRequest"): b',"spec":{"request":null,"signerName":""},"status":{}',
    ("coordination.k8s.io", "v1", "Lease"): b',"spec":{}',
    ("discovery.k8s.io", "v1", "EndpointSlice"): b',"addressType":"","endpoints":null,"ports":null',
    ("events.k8s.io", "v1", "Event"): b',"eventTime":null,"regarding":{},"deprecatedSource":{},"deprecatedFirstTimestamp":null,"deprecatedLastTimestamp":null',
    ("flowcontrol.apiserver.k8s.io", "v1", "FlowSchema"): b',"spec":{"priorityLevelConfiguration":{"name":""},"matchingPrecedence":0},"status":{}',
    ("flowcontrol.apiserver.k8s.io", "v1", "PriorityLevelConfiguration"): b',"spec":{"type":""},"status":{}',
    ("networking.k8s.io", "v1", "IPAddress"): b',"spec":{}',
    ("networking.k8s.io", "v1", "Ingress"): b',"spec":{},"status":{"loadBalancer":{}}',
    ("networking.k8s.io", "v1", "IngressClass"): b',"spec":{}',
    ("networking.k8s.io", "v1", "NetworkPolicy"): b',"spec":{"podSelector":{}}',
    ("networking.k8s.io", "v1", "ServiceCIDR"): b',"spec":{},"status":{}',
    ("node.k8s.io", "v1", "RuntimeClass"): b',"handler":""',
    ("policy", "v1", "PodDisruptionBudget"): b',"spec":{},"status":{"disruptionsAllowed":0,"currentHealthy":0,"desiredHealthy":0,"expectedPods":0}',
    ("rbac.authorization.k8s.io", "v1", "ClusterRole"): b',"rules":null',
    ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding"): b',"roleRef":{"apiGroup":"","kind":"","name":""}',
    ("rbac.authorization.k8s.io", "v1", "Role"): b',"rules":null',
    ("rbac.authorization.k8s.io", "v1", "RoleBinding"): b',"roleRef":{"apiGroup":"","kind":"","name":""}',
    ("resource.k8s.io", "v1", "DeviceClass"): b',"spec":{}',
    ("resource.k8s.io", "v1", "ResourceClaim"): b',"spec":{"devices":{"requests":null}},"status":{}',
    ("resource.k8s.io", "v1", "ResourceClaimTemplate"): b',"spec":{"metadata":{},"spec":{"devices":{"requests":null}}}',
    ("resource.k8s.io", "v1", "ResourceSlice"): b',"spec":{"driver":"","pool":{"name":"","generation":0,"resourceSliceCount":0}}',
    ("scheduling.k8s.io", "v1", "PriorityClass"): b',"value":0',
    ("storage.k8s.io", "v1", "CSIDriver"): b',"spec":{}',
    ("storage.k8s.io", "v1", "CSINode"): b',"spec":{"drivers":null}',
    ("storage.k8s.io", "v1", "CSIStorageCapacity"): b',"storageClassName":""',
    ("storage.k8s.io", "v1", "StorageClass"): b',"provisioner":""',
    ("storage.k8s.io", "v1", "VolumeAttachment"): b',"spec":{"attacher":"","source":{},"nodeName":""},"status":{"attached":false}',
    ("storage.k8s.io", "v1", "VolumeAttributesClass"): b',"driverName":""',
}
# fmt: on
