"""The ShiftQP state machine: every legal transition lands where DESIGN says; any other is refused."""

from __future__ import annotations

import pytest

from libshift.shift.states import RECV, SEND, IllegalTransition, Recv, Send, State, States, Transition

S, T = Send, Transition

# every legal transition, "from --transition--> to", as DESIGN's states read: states.py's table must be these
EDGES = """
idle --connect--> default
idle --no_backup--> plain
default --stop--> stopping
handshake --stop--> stopping
fallback --stop--> stopping
wait_signaled --stop--> stopping
wait_drained --stop--> stopping
stopping --failover--> handshake
stopping --failback--> wait_drained
handshake --resume--> fallback
wait_drained --resume--> default
fallback --fence--> wait_signaled
wait_signaled --stay--> fallback
"""
BREAKS = {(s, T.BREAK): S.BROKEN for s in Send if s is not S.BROKEN}  # an error to the application, any time


def edge(line: str) -> tuple[tuple[Send, Transition], Send]:
    start, transition, end = line.replace("--", " ").replace(">", "").split()
    return (Send(start), Transition(transition)), Send(end)


LEGAL = dict(edge(line) for line in EDGES.strip().splitlines()) | BREAKS


def at(send: Send, recv: Recv = Recv.DEFAULT) -> States:
    states = States()
    states.send, states.recv = send, recv
    return states


def test_the_table_is_the_one_written_here() -> None:
    assert SEND == LEGAL


@pytest.mark.parametrize(("start", "transition"), sorted(LEGAL, key=lambda k: (k[0].value, k[1].value)))
def test_every_legal_transition(start: Send, transition: Transition) -> None:
    recv = Recv.DEFAULT if transition is not T.FAILBACK else Recv.FALLBACK
    states = at(start, recv)
    states.step(transition)
    assert states.send is LEGAL[(start, transition)]


@pytest.mark.parametrize(
    ("start", "transition"),
    [(s, t) for s in Send for t in Transition if (s, t) not in LEGAL],
    ids=lambda x: x.value,
)
def test_every_other_transition_is_refused(start: Send, transition: Transition) -> None:
    states = at(start, Recv.FALLBACK)
    with pytest.raises(IllegalTransition):
        states.step(transition)
    assert (states.send, states.recv) == (start, Recv.FALLBACK)  # nothing changed


def test_the_receive_side_follows_the_path() -> None:
    assert RECV == {
        (Recv.DEFAULT, T.FAILOVER): Recv.FALLBACK,
        (Recv.FALLBACK, T.FAILOVER): Recv.FALLBACK,
        (Recv.FALLBACK, T.FAILBACK): Recv.DEFAULT,
    }
    states = at(S.STOPPING, Recv.DEFAULT)
    with pytest.raises(IllegalTransition):  # already on the default path: no failback onto it
        states.step(T.FAILBACK)
    assert states.send is S.STOPPING


def test_a_failover_and_a_failback_through_the_fence() -> None:
    """DESIGN's cycle: DEFAULT -> FALLBACK -> WAIT_SIGNALED -> WAIT_DRAINED -> DEFAULT, with the switches'
    own steps between, and the public state at each."""
    states = States()
    seen = [(states.send, states.recv, states.public)]
    for transition in (T.CONNECT, T.STOP, T.FAILOVER, T.RESUME, T.FENCE, T.STOP, T.FAILBACK, T.RESUME):
        states.step(transition)
        seen.append((states.send, states.recv, states.public))
    assert seen == [
        (S.IDLE, Recv.DEFAULT, State.IDLE),
        (S.DEFAULT, Recv.DEFAULT, State.DEFAULT),
        (S.STOPPING, Recv.DEFAULT, State.DEFAULT),
        (S.HANDSHAKE, Recv.FALLBACK, State.FALLBACK),
        (S.FALLBACK, Recv.FALLBACK, State.FALLBACK),
        (S.WAIT_SIGNALED, Recv.FALLBACK, State.FALLBACK),
        (S.STOPPING, Recv.FALLBACK, State.FALLBACK),
        (S.WAIT_DRAINED, Recv.DEFAULT, State.DEFAULT),
        (S.DEFAULT, Recv.DEFAULT, State.DEFAULT),
    ]


def test_the_lifecycle_states_are_public_as_they_are() -> None:
    assert [at(s).public for s in (S.IDLE, S.PLAIN, S.BROKEN)] == [State.IDLE, State.PLAIN, State.BROKEN]
    assert not any(at(s).live for s in (S.IDLE, S.PLAIN, S.BROKEN))
