from libshift.api.shift.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("host", "version", "uptime_seconds", "etcd_connected", "etcd_endpoints", "lease_id", "pending_writes", "nics", "agents", "failovers", "failbacks", "socket", "metrics_address", "udev", "serving_unix_nanos")
    HOST_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UPTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ETCD_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    ETCD_ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PENDING_WRITES_FIELD_NUMBER: _ClassVar[int]
    NICS_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    FAILOVERS_FIELD_NUMBER: _ClassVar[int]
    FAILBACKS_FIELD_NUMBER: _ClassVar[int]
    SOCKET_FIELD_NUMBER: _ClassVar[int]
    METRICS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    UDEV_FIELD_NUMBER: _ClassVar[int]
    SERVING_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    host: str
    version: str
    uptime_seconds: float
    etcd_connected: bool
    etcd_endpoints: _containers.RepeatedScalarFieldContainer[str]
    lease_id: int
    pending_writes: int
    nics: _containers.RepeatedCompositeFieldContainer[_common_pb2.Nic]
    agents: _containers.RepeatedCompositeFieldContainer[_common_pb2.AgentInfo]
    failovers: int
    failbacks: int
    socket: str
    metrics_address: str
    udev: str
    serving_unix_nanos: int
    def __init__(self, host: _Optional[str] = ..., version: _Optional[str] = ..., uptime_seconds: _Optional[float] = ..., etcd_connected: _Optional[bool] = ..., etcd_endpoints: _Optional[_Iterable[str]] = ..., lease_id: _Optional[int] = ..., pending_writes: _Optional[int] = ..., nics: _Optional[_Iterable[_Union[_common_pb2.Nic, _Mapping]]] = ..., agents: _Optional[_Iterable[_Union[_common_pb2.AgentInfo, _Mapping]]] = ..., failovers: _Optional[int] = ..., failbacks: _Optional[int] = ..., socket: _Optional[str] = ..., metrics_address: _Optional[str] = ..., udev: _Optional[str] = ..., serving_unix_nanos: _Optional[int] = ...) -> None: ...

class ListNicsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNicsResponse(_message.Message):
    __slots__ = ("nics",)
    NICS_FIELD_NUMBER: _ClassVar[int]
    nics: _containers.RepeatedCompositeFieldContainer[_common_pb2.Nic]
    def __init__(self, nics: _Optional[_Iterable[_Union[_common_pb2.Nic, _Mapping]]] = ...) -> None: ...

class FailNicRequest(_message.Message):
    __slots__ = ("device", "mode", "flap_period_seconds", "loss_percent", "rate_bits_per_second")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    FLAP_PERIOD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LOSS_PERCENT_FIELD_NUMBER: _ClassVar[int]
    RATE_BITS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    device: str
    mode: _common_pb2.FaultMode
    flap_period_seconds: float
    loss_percent: float
    rate_bits_per_second: int
    def __init__(self, device: _Optional[str] = ..., mode: _Optional[_Union[_common_pb2.FaultMode, str]] = ..., flap_period_seconds: _Optional[float] = ..., loss_percent: _Optional[float] = ..., rate_bits_per_second: _Optional[int] = ...) -> None: ...

class FailNicResponse(_message.Message):
    __slots__ = ("nic",)
    NIC_FIELD_NUMBER: _ClassVar[int]
    nic: _common_pb2.Nic
    def __init__(self, nic: _Optional[_Union[_common_pb2.Nic, _Mapping]] = ...) -> None: ...

class RecoverNicRequest(_message.Message):
    __slots__ = ("device",)
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    device: str
    def __init__(self, device: _Optional[str] = ...) -> None: ...

class RecoverNicResponse(_message.Message):
    __slots__ = ("nic",)
    NIC_FIELD_NUMBER: _ClassVar[int]
    nic: _common_pb2.Nic
    def __init__(self, nic: _Optional[_Union[_common_pb2.Nic, _Mapping]] = ...) -> None: ...

class StreamEventsRequest(_message.Message):
    __slots__ = ("backlog", "follow")
    BACKLOG_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    backlog: int
    follow: bool
    def __init__(self, backlog: _Optional[int] = ..., follow: _Optional[bool] = ...) -> None: ...

class AgentChange(_message.Message):
    __slots__ = ("agent", "registered")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    agent: _common_pb2.AgentInfo
    registered: bool
    def __init__(self, agent: _Optional[_Union[_common_pb2.AgentInfo, _Mapping]] = ..., registered: _Optional[bool] = ...) -> None: ...

class FaultChange(_message.Message):
    __slots__ = ("device", "mode")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    device: str
    mode: _common_pb2.FaultMode
    def __init__(self, device: _Optional[str] = ..., mode: _Optional[_Union[_common_pb2.FaultMode, str]] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("seq", "time_unix_nanos", "host", "nic", "failover", "agent", "fault")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    NIC_FIELD_NUMBER: _ClassVar[int]
    FAILOVER_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    FAULT_FIELD_NUMBER: _ClassVar[int]
    seq: int
    time_unix_nanos: int
    host: str
    nic: _common_pb2.NicEvent
    failover: _common_pb2.FailoverReport
    agent: AgentChange
    fault: FaultChange
    def __init__(self, seq: _Optional[int] = ..., time_unix_nanos: _Optional[int] = ..., host: _Optional[str] = ..., nic: _Optional[_Union[_common_pb2.NicEvent, _Mapping]] = ..., failover: _Optional[_Union[_common_pb2.FailoverReport, _Mapping]] = ..., agent: _Optional[_Union[AgentChange, _Mapping]] = ..., fault: _Optional[_Union[FaultChange, _Mapping]] = ...) -> None: ...
