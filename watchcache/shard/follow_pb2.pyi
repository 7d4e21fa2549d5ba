from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerRequest(_message.Message):
    __slots__ = ("follow", "metrics", "backfill", "status")
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    BACKFILL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    follow: FollowRequest
    metrics: MetricsRequest
    backfill: BackfillRequest
    status: StatusRequest
    def __init__(self, follow: _Optional[_Union[FollowRequest, _Mapping]] = ..., metrics: _Optional[_Union[MetricsRequest, _Mapping]] = ..., backfill: _Optional[_Union[BackfillRequest, _Mapping]] = ..., status: _Optional[_Union[StatusRequest, _Mapping]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: bytes
    def __init__(self, json: _Optional[bytes] = ...) -> None: ...

class MetricsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MetricsReply(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: bytes
    def __init__(self, text: _Optional[bytes] = ...) -> None: ...

class FollowRequest(_message.Message):
    __slots__ = ("resource", "follower", "resume_from", "protobuf")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_FIELD_NUMBER: _ClassVar[int]
    PROTOBUF_FIELD_NUMBER: _ClassVar[int]
    resource: str
    follower: int
    resume_from: int
    protobuf: bool
    def __init__(self, resource: _Optional[str] = ..., follower: _Optional[int] = ..., resume_from: _Optional[int] = ..., protobuf: _Optional[bool] = ...) -> None: ...

class BackfillRequest(_message.Message):
    __slots__ = ("resource_version", "through")
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    THROUGH_FIELD_NUMBER: _ClassVar[int]
    resource_version: int
    through: int
    def __init__(self, resource_version: _Optional[int] = ..., through: _Optional[int] = ...) -> None: ...

class Object(_message.Message):
    __slots__ = ("namespace", "name", "resource_version", "labels", "fields", "body", "protobuf")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    PROTOBUF_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    resource_version: int
    labels: _containers.ScalarMap[str, str]
    fields: _containers.ScalarMap[str, str]
    body: bytes
    protobuf: bool
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., resource_version: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., fields: _Optional[_Mapping[str, str]] = ..., body: _Optional[bytes] = ..., protobuf: _Optional[bool] = ...) -> None: ...

class Change(_message.Message):
    __slots__ = ("type", "object")
    class Type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ADDED: _ClassVar[Change.Type]
        MODIFIED: _ClassVar[Change.Type]
        DELETED: _ClassVar[Change.Type]
    ADDED: Change.Type
    MODIFIED: Change.Type
    DELETED: Change.Type
    TYPE_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    type: Change.Type
    object: Object
    def __init__(self, type: _Optional[_Union[Change.Type, str]] = ..., object: _Optional[_Union[Object, _Mapping]] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("objects", "resource_version", "last", "unresumable_resource_version")
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    UNRESUMABLE_RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    objects: _containers.RepeatedCompositeFieldContainer[Object]
    resource_version: int
    last: bool
    unresumable_resource_version: int
    def __init__(self, objects: _Optional[_Iterable[_Union[Object, _Mapping]]] = ..., resource_version: _Optional[int] = ..., last: _Optional[bool] = ..., unresumable_resource_version: _Optional[int] = ...) -> None: ...

class Events(_message.Message):
    __slots__ = ("changes",)
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[Change]
    def __init__(self, changes: _Optional[_Iterable[_Union[Change, _Mapping]]] = ...) -> None: ...

class Relist(_message.Message):
    __slots__ = ("changes", "resource_version")
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[Change]
    resource_version: int
    def __init__(self, changes: _Optional[_Iterable[_Union[Change, _Mapping]]] = ..., resource_version: _Optional[int] = ...) -> None: ...

class Resume(_message.Message):
    __slots__ = ("resource_version",)
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    resource_version: int
    def __init__(self, resource_version: _Optional[int] = ...) -> None: ...

class Span(_message.Message):
    __slots__ = ("resource_version", "through", "prior", "changes", "last")
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    THROUGH_FIELD_NUMBER: _ClassVar[int]
    PRIOR_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    resource_version: int
    through: int
    prior: _containers.RepeatedCompositeFieldContainer[Object]
    changes: _containers.RepeatedCompositeFieldContainer[Change]
    last: bool
    def __init__(self, resource_version: _Optional[int] = ..., through: _Optional[int] = ..., prior: _Optional[_Iterable[_Union[Object, _Mapping]]] = ..., changes: _Optional[_Iterable[_Union[Change, _Mapping]]] = ..., last: _Optional[bool] = ...) -> None: ...

class BackfillFailed(_message.Message):
    __slots__ = ("resource_version", "outcome", "message")
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    resource_version: int
    outcome: str
    message: str
    def __init__(self, resource_version: _Optional[int] = ..., outcome: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class FollowBatch(_message.Message):
    __slots__ = ("snapshot", "events", "progress", "relist", "resume", "span", "backfill_failed")
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    RELIST_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    SPAN_FIELD_NUMBER: _ClassVar[int]
    BACKFILL_FAILED_FIELD_NUMBER: _ClassVar[int]
    snapshot: Snapshot
    events: Events
    progress: int
    relist: Relist
    resume: Resume
    span: Span
    backfill_failed: BackfillFailed
    def __init__(self, snapshot: _Optional[_Union[Snapshot, _Mapping]] = ..., events: _Optional[_Union[Events, _Mapping]] = ..., progress: _Optional[int] = ..., relist: _Optional[_Union[Relist, _Mapping]] = ..., resume: _Optional[_Union[Resume, _Mapping]] = ..., span: _Optional[_Union[Span, _Mapping]] = ..., backfill_failed: _Optional[_Union[BackfillFailed, _Mapping]] = ...) -> None: ...
