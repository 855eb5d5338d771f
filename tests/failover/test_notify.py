"""Control messages: what goes into the peer's control word comes out the same, and nothing else does."""

import pytest

from libshift.shift.notify import Kind, Message, targets_of
from libshift.verbs import Endpoint, VerbsError


@pytest.mark.parametrize(
    "message",
    [
        Message(Kind.REARM, "primary", 1),
        Message(Kind.ARMED, "backup", 2**40),
        Message(Kind.REARM, "backup7", 3),
    ],
)
def test_a_message_survives_its_encoding(message: Message) -> None:
    assert Message.decode(message.encode()) == message


@pytest.mark.parametrize("word", [0, 0x0300, 0x0108, 0xFFFF])  # no kind 3, no path 8
def test_words_that_are_no_message_decode_to_none(word: int) -> None:
    assert Message.decode(word) is None


def test_the_control_targets_come_back_from_the_published_endpoint() -> None:
    where = {"primary": {"addr": 0x1000, "rkey": 11}, "backup": {"addr": 0x2000, "rkey": 22}}
    endpoint = Endpoint("::ffff:198.18.1.10", 4791, 7, "mlx5_1", "tcp", {"port": 4791, "shift_notify": where})
    assert targets_of(Endpoint.from_json(endpoint.to_json())) == {
        "primary": (0x1000, 11),
        "backup": (0x2000, 22),
    }
    bare = Endpoint("::ffff:198.18.1.10", 4791, 7, "mlx5_1", "tcp", {"port": 4791})
    with pytest.raises(VerbsError, match="carries no shift_notify targets"):
        targets_of(bare)


def test_a_peer_with_more_backups_advertises_a_target_for_each() -> None:
    where = {
        path: {"addr": 0x1000 * (i + 1), "rkey": i} for i, path in enumerate(("primary", "backup", "backup2"))
    }
    endpoint = Endpoint("::ffff:198.18.1.10", 4791, 7, "mlx5_1", "tcp", {"shift_notify": where})
    assert targets_of(endpoint) == {"primary": (0x1000, 0), "backup": (0x2000, 1), "backup2": (0x3000, 2)}
    del where["backup"]  # the backup's is needed for any failover at all
    with pytest.raises(VerbsError, match="carries no shift_notify targets"):
        targets_of(endpoint)
