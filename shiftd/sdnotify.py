"""systemd's notify protocol (sd_notify) without libsystemd: READY, WATCHDOG, STOPPING, STATUS.

Outside systemd (no NOTIFY_SOCKET) every call is a no-op, so the daemon calls it freely.
"""

from __future__ import annotations

import os
import socket
from contextlib import suppress


class Notifier:
    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):
            address = "\0" + address[1:]
        self._address = address or None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        watchdog = usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid()))
        self.watchdog_interval: float | None = int(usec) / 2e6 if watchdog else None

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, *fields: str) -> None:
        if self._address is None:
            return
        # OSError: systemd went away; nothing useful to do about it
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock, suppress(OSError):
            sock.sendto("\n".join(fields).encode(), self._address)

    def ready(self, status: str = "") -> None:
        self.notify("READY=1", f"MAINPID={os.getpid()}", *([f"STATUS={status}"] if status else []))

    def watchdog(self) -> None:
        self.notify("WATCHDOG=1")

    def stopping(self) -> None:
        self.notify("STOPPING=1")

    def status(self, text: str) -> None:
        self.notify(f"STATUS={text}")
