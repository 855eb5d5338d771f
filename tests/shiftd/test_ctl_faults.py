"""shiftctl fail-nic's arguments: each mode's parameter, and a mistake in one is a single line and exit 2,
said before any call (the socket here does not exist: reaching for it would be exit 1)."""

from __future__ import annotations

import pytest

from shiftd import ctl
from shiftd.fault_spec import Fault
from shiftd.nic import FaultMode

NO_SOCKET = "/nonexistent/shiftd.sock"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mode", "lossy"], "--mode lossy needs --loss (e.g. --loss 5%)"),
        (["--mode", "lossy", "--loss", "5x"], "loss '5x' is not a percentage (e.g. 5% or 0.5%)"),
        (["--mode", "lossy", "--loss=-5%"], "loss '-5%' is not a percentage (e.g. 5% or 0.5%)"),
        (
            ["--mode", "lossy", "--loss", "150%"],
            "loss must be greater than 0% and less than 100% (for 100%, mode blackhole), not 150%",
        ),
        (["--mode", "lossy", "--loss", "0%"], "not 0%"),
        (["--mode", "slow"], "--mode slow needs --rate (e.g. --rate 100mbit)"),
        (["--mode", "slow", "--rate", "100mbps"], "rate '100mbps' is not in bits per second (e.g. 100mbit"),
        (["--mode", "slow", "--rate", "100"], "rate '100' is not in bits per second"),
        (["--mode", "slow", "--rate", "20tbit"], "rate must be from 1kbit to 10tbit, not 20tbit"),
        (["--loss", "5%"], "a loss is for mode lossy only, not down"),
        (["--mode", "slow", "--rate", "1gbit", "--loss", "1%"], "a loss is for mode lossy only, not slow"),
        (
            ["--mode", "flap", "--period", "-1"],
            "flap period must be greater than 0 and at most 3600 s, not -1",
        ),
    ],
)
def test_a_bad_fault_parameter_is_one_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ctl.main(["--socket", NO_SOCKET, "fail-nic", "mlx5_0", *args]) == ctl.EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("shiftctl: ")
    assert message in err


@pytest.mark.parametrize(
    ("args", "fault"),
    [
        ([], Fault(FaultMode.DOWN)),
        (["--mode", "flap", "--period", "0.5"], Fault(FaultMode.FLAP, period=0.5)),
        (["--mode", "lossy", "--loss", "5%"], Fault(FaultMode.LOSSY, loss_percent=5.0)),
        (["--mode", "lossy", "--loss", "0.25"], Fault(FaultMode.LOSSY, loss_percent=0.25)),
        (["--mode", "slow", "--rate", "100mbit"], Fault(FaultMode.SLOW, rate_bits=100_000_000)),
        (["--mode", "slow", "--rate", "2.5Gbit"], Fault(FaultMode.SLOW, rate_bits=2_500_000_000)),
    ],
)
def test_good_arguments_make_the_fault_they_say(args: list[str], fault: Fault) -> None:
    parsed = ctl.build_parser().parse_args(["fail-nic", "mlx5_0", *args])
    assert ctl.fault_of(parsed) == fault


def test_good_arguments_then_need_the_daemon(capsys: pytest.CaptureFixture[str]) -> None:
    assert ctl.main(["--socket", NO_SOCKET, "fail-nic", "mlx5_0", "--mode", "slow", "--rate", "1gbit"]) == 1
    assert "no shiftd socket at /nonexistent/shiftd.sock" in capsys.readouterr().err


def test_help_explains_every_mode_and_its_parameter(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        ctl.main(["fail-nic", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for mode in ctl.MODES:
        assert f"\n  {mode} " in text
    for words in (
        "--loss PERCENT",
        "--rate RATE",
        "100mbit",
        "5%",
        "DEGRADED",
        "recover-nic DEVICE` removes any",
    ):
        assert words in text
