from libshift.api.shift.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterRequest(_message.Message):
    __slots__ = ("pid", "name", "job", "paths", "instance", "reports_dropped")
    PID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    REPORTS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    pid: int
    name: str
    job: str
    paths: _common_pb2.QpPaths
    instance: str
    reports_dropped: int
    def __init__(self, pid: _Optional[int] = ..., name: _Optional[str] = ..., job: _Optional[str] = ..., paths: _Optional[_Union[_common_pb2.QpPaths, _Mapping]] = ..., instance: _Optional[str] = ..., reports_dropped: _Optional[int] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("agent_id", "host", "nics")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    NICS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    host: str
    nics: _containers.RepeatedCompositeFieldContainer[_common_pb2.Nic]
    def __init__(self, agent_id: _Optional[str] = ..., host: _Optional[str] = ..., nics: _Optional[_Iterable[_Union[_common_pb2.Nic, _Mapping]]] = ...) -> None: ...

class UnregisterRequest(_message.Message):
    __slots__ = ("agent_id",)
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    def __init__(self, agent_id: _Optional[str] = ...) -> None: ...

class UnregisterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchNicEventsRequest(_message.Message):
    __slots__ = ("agent_id",)
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    def __init__(self, agent_id: _Optional[str] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ("agent_id", "qps", "mrs")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    QPS_FIELD_NUMBER: _ClassVar[int]
    MRS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    qps: _containers.RepeatedCompositeFieldContainer[_common_pb2.QpMapping]
    mrs: _containers.RepeatedCompositeFieldContainer[_common_pb2.MrMapping]
    def __init__(self, agent_id: _Optional[str] = ..., qps: _Optional[_Iterable[_Union[_common_pb2.QpMapping, _Mapping]]] = ..., mrs: _Optional[_Iterable[_Union[_common_pb2.MrMapping, _Mapping]]] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("stored", "pending")
    STORED_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    stored: bool
    pending: int
    def __init__(self, stored: _Optional[bool] = ..., pending: _Optional[int] = ...) -> None: ...

class WithdrawRequest(_message.Message):
    __slots__ = ("agent_id", "qps", "mrs")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    QPS_FIELD_NUMBER: _ClassVar[int]
    MRS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    qps: _containers.RepeatedCompositeFieldContainer[_common_pb2.Endpoint]
    mrs: _containers.RepeatedCompositeFieldContainer[_common_pb2.MrMapping]
    def __init__(self, agent_id: _Optional[str] = ..., qps: _Optional[_Iterable[_Union[_common_pb2.Endpoint, _Mapping]]] = ..., mrs: _Optional[_Iterable[_Union[_common_pb2.MrMapping, _Mapping]]] = ...) -> None: ...

class WithdrawResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LookupQpRequest(_message.Message):
    __slots__ = ("gid", "qpn", "wait_seconds")
    GID_FIELD_NUMBER: _ClassVar[int]
    QPN_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    gid: str
    qpn: int
    wait_seconds: float
    def __init__(self, gid: _Optional[str] = ..., qpn: _Optional[int] = ..., wait_seconds: _Optional[float] = ...) -> None: ...

class LookupQpResponse(_message.Message):
    __slots__ = ("mapping",)
    MAPPING_FIELD_NUMBER: _ClassVar[int]
    mapping: _common_pb2.QpMapping
    def __init__(self, mapping: _Optional[_Union[_common_pb2.QpMapping, _Mapping]] = ...) -> None: ...

class LookupMrRequest(_message.Message):
    __slots__ = ("gid", "rkey", "wait_seconds")
    GID_FIELD_NUMBER: _ClassVar[int]
    RKEY_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    gid: str
    rkey: int
    wait_seconds: float
    def __init__(self, gid: _Optional[str] = ..., rkey: _Optional[int] = ..., wait_seconds: _Optional[float] = ...) -> None: ...

class LookupMrResponse(_message.Message):
    __slots__ = ("mapping",)
    MAPPING_FIELD_NUMBER: _ClassVar[int]
    mapping: _common_pb2.MrMapping
    def __init__(self, mapping: _Optional[_Union[_common_pb2.MrMapping, _Mapping]] = ...) -> None: ...

class ReportFailoverRequest(_message.Message):
    __slots__ = ("agent_id", "report", "instance", "seq", "paths", "reports_dropped", "more")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    REPORTS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    report: _common_pb2.FailoverReport
    instance: str
    seq: int
    paths: _common_pb2.QpPaths
    reports_dropped: int
    more: _containers.RepeatedCompositeFieldContainer[_common_pb2.FailoverReport]
    def __init__(self, agent_id: _Optional[str] = ..., report: _Optional[_Union[_common_pb2.FailoverReport, _Mapping]] = ..., instance: _Optional[str] = ..., seq: _Optional[int] = ..., paths: _Optional[_Union[_common_pb2.QpPaths, _Mapping]] = ..., reports_dropped: _Optional[int] = ..., more: _Optional[_Iterable[_Union[_common_pb2.FailoverReport, _Mapping]]] = ...) -> None: ...

class ReportFailoverResponse(_message.Message):
    __slots__ = ("duplicate",)
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    def __init__(self, duplicate: _Optional[bool] = ...) -> None: ...
