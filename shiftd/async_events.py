"""The RDMA devices' async events, as a prompt to read their ports again.

rdma-core delivers IBV_EVENT_PORT_ERR and IBV_EVENT_PORT_ACTIVE to every process that has the device open,
the moment the kernel moves the port (rxe: within a few milliseconds of its netdev's carrier). The sysfs
monitor polls the ports every `rdma_poll_seconds`; with these events it reads them at once instead. The
event says when to look, sysfs says what the port is now, so the monitor keeps one view of every port
(and its flap detection) whichever woke it.

Each device is opened as libshift's verbs provider opens it (the same reader thread, waiting on the event
file without the GIL); a device rdma-core does not list (a fixture tree, a host without RDMA) is simply
not watched, and the poll goes on as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from libshift.providers.verbs import VerbsProvider
from libshift.providers.verbs.events import AsyncEvent, Scope
from libshift.vocabulary.errors import VerbsError

if TYPE_CHECKING:
    from libshift.providers.verbs.context import VerbsContext

log = logging.getLogger(__name__)
PORT_SCOPES = (Scope.PORT, Scope.DEVICE)  # the events that can change what a port reads


class AsyncPortEvents:
    """The open devices of `names` that rdma-core lists; `on_event(device)` runs on a reader thread."""

    def __init__(self, names: Iterable[str], on_event: Callable[[str], None]) -> None:
        self._on_event = on_event
        self.contexts: dict[str, VerbsContext] = {}
        wanted = set(names)
        provider = VerbsProvider()
        for device in provider.devices():
            if device.name not in wanted:
                continue
            try:
                context = provider.open(device)
            except VerbsError as exc:
                log.warning("%s: async events not watched, the port is only polled (%s)", device.name, exc)
                continue
            context.add_event_listener(self._heard)
            self.contexts[device.name] = context
        if self.contexts:
            log.info("watching the async events of %s", ", ".join(sorted(self.contexts)))

    def _heard(self, event: AsyncEvent) -> None:
        if event.meaning.scope in PORT_SCOPES:
            self._on_event(event.device)

    def close(self) -> None:
        for context in self.contexts.values():
            context.close()
        self.contexts.clear()
