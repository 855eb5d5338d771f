"""The states of a ShiftQP, as DESIGN section 5 draws them, and the one place where they change.

Send side: DEFAULT -> FALLBACK -> WAIT_SIGNALED -> WAIT_DRAINED -> DEFAULT, with the steps DESIGN leaves
implicit spelled out:

- DEFAULT: on the default path, sends go out.
- STOPPING: a switch is stopping the path it leaves and draining its CQs; that path's errors are expected
  (its WRs stay outstanding). Always followed by HANDSHAKE or WAIT_DRAINED, or by BROKEN.
- HANDSHAKE: on a backup path, our count sent, sends held until the peer's count comes (the failover's
  drain: the counts settle what each side has).
- FALLBACK: on a backup path, sends go out.
- WAIT_SIGNALED: on a backup path, failing back: the probe of the re-armed default path went through, new
  sends are held until the sends posted on the backup have completed (each provider WR is signaled: the
  last one posted is the fence) or FENCE_WAIT has passed.
- WAIT_DRAINED: back on the default path, our count sent, sends held until the peer's count comes (the
  failback's drain).
- IDLE before connect, PLAIN without a backup, BROKEN once an error has gone to the application.

Receive side: DEFAULT <-> FALLBACK, the path receives are posted on (they are never held; a switch moves
them). `State` is the public view (`qp.state`): the lifecycle, or which side of the path the QP is on.
"""

from __future__ import annotations

import enum


class State(enum.Enum):
    """What `ShiftQP.state` says."""

    IDLE = "idle"
    DEFAULT = "default"
    FALLBACK = "fallback"
    PLAIN = "plain"
    BROKEN = "broken"


class Send(enum.Enum):
    IDLE = "idle"
    PLAIN = "plain"
    DEFAULT = "default"
    STOPPING = "stopping"
    HANDSHAKE = "handshake"
    FALLBACK = "fallback"
    WAIT_SIGNALED = "wait_signaled"
    WAIT_DRAINED = "wait_drained"
    BROKEN = "broken"


class Recv(enum.Enum):
    DEFAULT = "default"
    FALLBACK = "fallback"


class Transition(enum.Enum):
    CONNECT = "connect"  # the backups are connected
    NO_BACKUP = "no_backup"  # connected without any: a plain QP
    STOP = "stop"  # a switch begins: the path in use is stopped and drained
    FAILOVER = "failover"  # the old path is stopped: on to a backup, our count sent
    FAILBACK = "failback"  # the old path is stopped: back onto the default path, our count sent
    RESUME = "resume"  # the peer's count is in: what it lacks is posted again, sends go out
    FENCE = "fence"  # the failback's probe went through with sends in flight on the backup
    STAY = "stay"  # the default path went down during the fence: the held sends go out on the backup
    BREAK = "break"  # an error went to the application


class IllegalTransition(AssertionError):
    """A transition the state machine does not have: a bug in the failover layer."""


S, T = Send, Transition
LIVE = frozenset({S.DEFAULT, S.STOPPING, S.HANDSHAKE, S.FALLBACK, S.WAIT_SIGNALED, S.WAIT_DRAINED})
SWITCHABLE = LIVE - {S.STOPPING}  # where a switch may begin (also in the middle of another's handshake)
HELD = frozenset({S.STOPPING, S.HANDSHAKE, S.WAIT_SIGNALED, S.WAIT_DRAINED})  # new sends wait
AWAITING_COUNT = frozenset({S.HANDSHAKE, S.WAIT_DRAINED})

SEND: dict[tuple[Send, Transition], Send] = {
    (S.IDLE, T.CONNECT): S.DEFAULT,
    (S.IDLE, T.NO_BACKUP): S.PLAIN,
    **{(s, T.STOP): S.STOPPING for s in SWITCHABLE},
    (S.STOPPING, T.FAILOVER): S.HANDSHAKE,
    (S.STOPPING, T.FAILBACK): S.WAIT_DRAINED,
    (S.HANDSHAKE, T.RESUME): S.FALLBACK,
    (S.WAIT_DRAINED, T.RESUME): S.DEFAULT,
    (S.FALLBACK, T.FENCE): S.WAIT_SIGNALED,
    (S.WAIT_SIGNALED, T.STAY): S.FALLBACK,
    **{(s, T.BREAK): S.BROKEN for s in Send if s is not S.BROKEN},
}
RECV: dict[tuple[Recv, Transition], Recv] = {
    (Recv.DEFAULT, T.FAILOVER): Recv.FALLBACK,
    (Recv.FALLBACK, T.FAILOVER): Recv.FALLBACK,  # on from the backup to the backup's backup
    (Recv.FALLBACK, T.FAILBACK): Recv.DEFAULT,
}


class States:
    """A QP's send and receive states; `step` is the only way they change."""

    __slots__ = ("recv", "send")

    def __init__(self) -> None:
        self.send = Send.IDLE
        self.recv = Recv.DEFAULT

    def step(self, transition: Transition) -> None:
        send = SEND.get((self.send, transition))
        if send is None:
            raise IllegalTransition(f"no {transition.value} from send state {self.send.value}")
        if transition in (T.FAILOVER, T.FAILBACK):
            recv = RECV.get((self.recv, transition))
            if recv is None:
                raise IllegalTransition(f"no {transition.value} from receive state {self.recv.value}")
            self.recv = recv
        self.send = send

    @property
    def public(self) -> State:
        if self.send in LIVE:
            return State.DEFAULT if self.recv is Recv.DEFAULT else State.FALLBACK
        return PUBLIC[self.send]

    @property
    def live(self) -> bool:
        """Connected with a backup and not broken: a switch is possible."""
        return self.send in LIVE


PUBLIC = {S.IDLE: State.IDLE, S.PLAIN: State.PLAIN, S.BROKEN: State.BROKEN}
