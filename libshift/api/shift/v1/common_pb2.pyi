from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NicState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NIC_STATE_UNSPECIFIED: _ClassVar[NicState]
    NIC_STATE_UP: _ClassVar[NicState]
    NIC_STATE_DOWN: _ClassVar[NicState]
    NIC_STATE_DEGRADED: _ClassVar[NicState]

class FaultMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAULT_MODE_UNSPECIFIED: _ClassVar[FaultMode]
    FAULT_MODE_DOWN: _ClassVar[FaultMode]
    FAULT_MODE_BLACKHOLE: _ClassVar[FaultMode]
    FAULT_MODE_FLAP: _ClassVar[FaultMode]
    FAULT_MODE_LOSSY: _ClassVar[FaultMode]
    FAULT_MODE_SLOW: _ClassVar[FaultMode]

class FailoverKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAILOVER_KIND_UNSPECIFIED: _ClassVar[FailoverKind]
    FAILOVER_KIND_FAILOVER: _ClassVar[FailoverKind]
    FAILOVER_KIND_FAILBACK: _ClassVar[FailoverKind]
NIC_STATE_UNSPECIFIED: NicState
NIC_STATE_UP: NicState
NIC_STATE_DOWN: NicState
NIC_STATE_DEGRADED: NicState
FAULT_MODE_UNSPECIFIED: FaultMode
FAULT_MODE_DOWN: FaultMode
FAULT_MODE_BLACKHOLE: FaultMode
FAULT_MODE_FLAP: FaultMode
FAULT_MODE_LOSSY: FaultMode
FAULT_MODE_SLOW: FaultMode
FAILOVER_KIND_UNSPECIFIED: FailoverKind
FAILOVER_KIND_FAILOVER: FailoverKind
FAILOVER_KIND_FAILBACK: FailoverKind

class Nic(_message.Message):
    __slots__ = ("device", "netdev", "provider", "state", "reason", "admin_up", "operstate", "carrier", "port_state", "fault", "addresses", "last_change_unix_nanos", "link_events", "gid", "flap_penalty")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    NETDEV_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ADMIN_UP_FIELD_NUMBER: _ClassVar[int]
    OPERSTATE_FIELD_NUMBER: _ClassVar[int]
    CARRIER_FIELD_NUMBER: _ClassVar[int]
    PORT_STATE_FIELD_NUMBER: _ClassVar[int]
    FAULT_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    LAST_CHANGE_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    LINK_EVENTS_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    FLAP_PENALTY_FIELD_NUMBER: _ClassVar[int]
    device: str
    netdev: str
    provider: str
    state: NicState
    reason: str
    admin_up: bool
    operstate: str
    carrier: bool
    port_state: str
    fault: FaultMode
    addresses: _containers.RepeatedScalarFieldContainer[str]
    last_change_unix_nanos: int
    link_events: int
    gid: str
    flap_penalty: float
    def __init__(self, device: _Optional[str] = ..., netdev: _Optional[str] = ..., provider: _Optional[str] = ..., state: _Optional[_Union[NicState, str]] = ..., reason: _Optional[str] = ..., admin_up: _Optional[bool] = ..., operstate: _Optional[str] = ..., carrier: _Optional[bool] = ..., port_state: _Optional[str] = ..., fault: _Optional[_Union[FaultMode, str]] = ..., addresses: _Optional[_Iterable[str]] = ..., last_change_unix_nanos: _Optional[int] = ..., link_events: _Optional[int] = ..., gid: _Optional[str] = ..., flap_penalty: _Optional[float] = ...) -> None: ...

class NicEvent(_message.Message):
    __slots__ = ("host", "device", "netdev", "state", "previous_state", "reason", "time_unix_nanos", "monotonic_nanos", "gid", "move_off", "previous_gid")
    HOST_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    NETDEV_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    MONOTONIC_NANOS_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    MOVE_OFF_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_GID_FIELD_NUMBER: _ClassVar[int]
    host: str
    device: str
    netdev: str
    state: NicState
    previous_state: NicState
    reason: str
    time_unix_nanos: int
    monotonic_nanos: int
    gid: str
    move_off: bool
    previous_gid: str
    def __init__(self, host: _Optional[str] = ..., device: _Optional[str] = ..., netdev: _Optional[str] = ..., state: _Optional[_Union[NicState, str]] = ..., previous_state: _Optional[_Union[NicState, str]] = ..., reason: _Optional[str] = ..., time_unix_nanos: _Optional[int] = ..., monotonic_nanos: _Optional[int] = ..., gid: _Optional[str] = ..., move_off: _Optional[bool] = ..., previous_gid: _Optional[str] = ...) -> None: ...

class Endpoint(_message.Message):
    __slots__ = ("gid", "qpn", "psn", "device", "provider_data", "provider")
    class ProviderDataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    GID_FIELD_NUMBER: _ClassVar[int]
    QPN_FIELD_NUMBER: _ClassVar[int]
    PSN_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_DATA_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    gid: str
    qpn: int
    psn: int
    device: str
    provider_data: _containers.ScalarMap[str, str]
    provider: str
    def __init__(self, gid: _Optional[str] = ..., qpn: _Optional[int] = ..., psn: _Optional[int] = ..., device: _Optional[str] = ..., provider_data: _Optional[_Mapping[str, str]] = ..., provider: _Optional[str] = ...) -> None: ...

class QpMapping(_message.Message):
    __slots__ = ("primary", "backup")
    PRIMARY_FIELD_NUMBER: _ClassVar[int]
    BACKUP_FIELD_NUMBER: _ClassVar[int]
    primary: Endpoint
    backup: Endpoint
    def __init__(self, primary: _Optional[_Union[Endpoint, _Mapping]] = ..., backup: _Optional[_Union[Endpoint, _Mapping]] = ...) -> None: ...

class MrMapping(_message.Message):
    __slots__ = ("gid", "rkey", "backup_gid", "backup_rkey")
    GID_FIELD_NUMBER: _ClassVar[int]
    RKEY_FIELD_NUMBER: _ClassVar[int]
    BACKUP_GID_FIELD_NUMBER: _ClassVar[int]
    BACKUP_RKEY_FIELD_NUMBER: _ClassVar[int]
    gid: str
    rkey: int
    backup_gid: str
    backup_rkey: int
    def __init__(self, gid: _Optional[str] = ..., rkey: _Optional[int] = ..., backup_gid: _Optional[str] = ..., backup_rkey: _Optional[int] = ...) -> None: ...

class FailoverReport(_message.Message):
    __slots__ = ("kind", "device", "backup_device", "reason", "downtime_seconds", "reposted_work_requests", "qps", "time_unix_nanos", "default_device")
    KIND_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    BACKUP_DEVICE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DOWNTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REPOSTED_WORK_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    QPS_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_DEVICE_FIELD_NUMBER: _ClassVar[int]
    kind: FailoverKind
    device: str
    backup_device: str
    reason: str
    downtime_seconds: float
    reposted_work_requests: int
    qps: int
    time_unix_nanos: int
    default_device: str
    def __init__(self, kind: _Optional[_Union[FailoverKind, str]] = ..., device: _Optional[str] = ..., backup_device: _Optional[str] = ..., reason: _Optional[str] = ..., downtime_seconds: _Optional[float] = ..., reposted_work_requests: _Optional[int] = ..., qps: _Optional[int] = ..., time_unix_nanos: _Optional[int] = ..., default_device: _Optional[str] = ...) -> None: ...

class QpPath(_message.Message):
    __slots__ = ("default_device", "device", "qps")
    DEFAULT_DEVICE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    QPS_FIELD_NUMBER: _ClassVar[int]
    default_device: str
    device: str
    qps: int
    def __init__(self, default_device: _Optional[str] = ..., device: _Optional[str] = ..., qps: _Optional[int] = ...) -> None: ...

class QpPaths(_message.Message):
    __slots__ = ("paths",)
    PATHS_FIELD_NUMBER: _ClassVar[int]
    paths: _containers.RepeatedCompositeFieldContainer[QpPath]
    def __init__(self, paths: _Optional[_Iterable[_Union[QpPath, _Mapping]]] = ...) -> None: ...

class AgentInfo(_message.Message):
    __slots__ = ("agent_id", "pid", "uid", "name", "job", "registered_unix_nanos", "qp_mappings", "mr_mappings", "qps_on_backup", "reports_dropped")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    QP_MAPPINGS_FIELD_NUMBER: _ClassVar[int]
    MR_MAPPINGS_FIELD_NUMBER: _ClassVar[int]
    QPS_ON_BACKUP_FIELD_NUMBER: _ClassVar[int]
    REPORTS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    pid: int
    uid: int
    name: str
    job: str
    registered_unix_nanos: int
    qp_mappings: int
    mr_mappings: int
    qps_on_backup: int
    reports_dropped: int
    def __init__(self, agent_id: _Optional[str] = ..., pid: _Optional[int] = ..., uid: _Optional[int] = ..., name: _Optional[str] = ..., job: _Optional[str] = ..., registered_unix_nanos: _Optional[int] = ..., qp_mappings: _Optional[int] = ..., mr_mappings: _Optional[int] = ..., qps_on_backup: _Optional[int] = ..., reports_dropped: _Optional[int] = ...) -> None: ...
