"""One TCP stream of a QP: frames out gathered with sendmsg, frames in placed with recv_into.

The Connection knows framing only. What a frame means, and where its payload goes, is the sink's (the QP's)
business: on_header() answers with the memoryviews to place the payload into (straight into registered
memory, no copy), or None to read it into a scratch buffer and drop it.
"""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from libshift.providers.tcp import wire
from libshift.providers.tcp.engine import READ, STAGING, WRITE, Engine

Buffers = list[memoryview]
READ_BUDGET = 4 << 20  # bytes per wake-up before other sockets get their turn
DIRECT = 1 << 14
GATHER_BYTES, GATHER_BUFFERS = 1 << 16, 64  # a sendmsg takes queued requests up to this size / iovec count
HEADER_SIZE = wire.HEADER.size
_NOTHING = memoryview(b"")
_NO_FRAME: Sequence[bytes | memoryview] = ()


class Sink(Protocol):
    def on_header(self, conn: Connection, hdr: wire.Header) -> Sequence[memoryview] | None: ...
    def on_frame(self, conn: Connection, hdr: wire.Header, placed: bool) -> None: ...
    def after_input(self, conn: Connection) -> None: ...
    def next_request(self, conn: Connection) -> Sequence[bytes | memoryview] | None: ...
    def on_broken(self, conn: Connection, reason: str) -> None: ...
    def on_engine_error(self, exc: BaseException) -> None: ...


def _rest(buffers: Sequence[bytes | memoryview], sent: int) -> Buffers:
    """What is left of a frame after `sent` of its bytes went out, as non-empty memoryviews."""
    rest: Buffers = []
    for buf in buffers:
        size = len(buf)
        if sent >= size:
            sent -= size
            continue
        rest.append(memoryview(buf)[sent:])
        sent = 0
    return rest


class Connection:
    def __init__(self, engine: Engine, sock: socket.socket, sink: Sink) -> None:
        self.engine = engine
        self.sock = sock
        self.sink = sink
        self.closed = False
        self.closing = False
        self._shut = False
        self._out: deque[Sequence[bytes | memoryview]] = deque()
        self._cur: Sequence[bytes | memoryview] = _NO_FRAME  # the frame being sent (the rest of it)
        self._want_write = False
        self._bulk = False  # as last told to the engine (see Engine.bulk)
        self._hdr = bytearray(HEADER_SIZE)
        self._hdr_view = memoryview(self._hdr)
        self._hdr_got = 0
        self._frame: wire.Header | None = None
        self._targets: list[memoryview] = []
        self._left = 0
        self._placing = False
        self._rx_view = _NOTHING  # staged input not parsed yet is _rx_view[_rx_pos:_rx_end]
        self._rx_pos = self._rx_end = 0
        engine.watch(sock.fileno(), READ, self._ready, sink.on_engine_error)

    # -- output -------------------------------------------------------------------------------------------

    def send_frame(self, buffers: Sequence[bytes | memoryview]) -> None:
        """Queue a frame ahead of further requests (responses go first) and try to send it now."""
        self._out.append(buffers)
        self.pump()

    def close_when_sent(self) -> None:
        """Send what is queued (a NAK), then half-close; used when the QP goes to ERR.

        Closing outright with unread input would make the kernel send RST, and an RST can destroy the NAK
        in the peer's receive queue before the peer reads it; so we send FIN and keep reading (and dropping)
        until the peer closes too.
        """
        self.closing = True
        self.pump()

    def pump(self) -> None:
        """Write frames until the socket is full or nothing is left; caller holds the engine lock.

        A frame goes to sendmsg as the buffers it was made of; only a partial send turns the rest into
        memoryviews to slice (the usual small frame leaves in one call, with no copy and no slicing)."""
        sock, out = self.sock, self._out
        while not self.closed:
            cur = self._cur
            if not cur:
                if out:
                    cur = out.popleft()
                elif self.closing:
                    break
                else:
                    cur = self.sink.next_request(self)
                    if cur is None:
                        break
                    cur = self._gather(cur)
            try:
                sent = sock.sendmsg(cur)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                self._broken(f"send failed: {exc.strerror or exc}")
                return
            if sent < sum(map(len, cur)):
                self._cur = _rest(cur, sent)
                self._set_want_write(True)
                return
            self._cur = _NO_FRAME
        if self._want_write:
            self._set_want_write(False)
        if self.closing and not self._shut and not self._cur and not out:
            self._shut = True
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                self.close()

    def _gather(self, frame: list[bytes | memoryview]) -> list[bytes | memoryview]:
        """More queued requests behind `frame`, in one sendmsg: a burst of posts (a replay after a switch,
        a list posted at once) costs one system call, not one each. Small frames only: a large one is the
        socket's work anyway."""
        size = sum(map(len, frame))
        while size < GATHER_BYTES and len(frame) < GATHER_BUFFERS:
            more = self.sink.next_request(self)
            if more is None:
                break
            frame = frame + more
            size += sum(map(len, more))
        return frame

    def _set_want_write(self, want: bool) -> None:
        if want != self._want_write and not self.closed:
            self._want_write = want
            events = READ | (WRITE if want else 0)
            self.engine.watch(self.sock.fileno(), events, self._ready, self.sink.on_engine_error)
            self._note_bulk()

    def _note_bulk(self) -> None:
        """Tell the engine whether this stream is in the middle of a bulk transfer, when that changes."""
        bulk = self._want_write or (self._frame is not None and self._left >= DIRECT)
        if bulk != self._bulk:
            self._bulk = bulk
            self.engine.bulk(self.sock.fileno(), bulk)

    # -- input --------------------------------------------------------------------------------------------

    def _ready(self, mask: int) -> None:
        if mask & WRITE:
            self.pump()
        if mask & READ and not self.closed:
            self._read()
            if not self.closed:
                self._note_bulk()
                self.sink.after_input(self)

    def read_pending(self) -> None:
        """Read what the socket holds now, as epoll would have reported it; for a deadline that falls due
        while the engine was busy with other sockets (with a thousand of them, one epoll wait does not even
        return them all), so that an ack already here is not missed."""
        self._ready(READ)

    def _read(self) -> None:
        """Parse frames from a small staging buffer; large payloads bypass it and land straight in place.

        One recv brings many small frames (headers, acks, short messages) at once, which matters more than a
        copy of a few bytes; a payload of DIRECT bytes or more is read by recv_into the target memory itself.
        """
        try:
            self._parse()
        finally:
            self._unstage()

    def _parse(self) -> None:
        budget = READ_BUDGET
        drained = False  # a small read came back short: the socket is empty (epoll reports the rest later)
        while budget > 0 and not self.closed:
            pos, end = self._rx_pos, self._rx_end
            if pos == end:
                if self._frame is not None and self._left >= DIRECT:  # a stream: read on while it flows
                    view = self._targets[0] if self._placing else self._stage()
                    got = self._recv(view[: self._left])
                    if got is None:
                        return
                    self._consume(got)
                    budget -= got
                    continue
                if drained:
                    return  # saves a recv that would only say EAGAIN, on every small message
                got = self._recv(self._stage())
                if got is None:
                    return
                drained = got < STAGING
                pos, end = 0, got
                self._rx_pos, self._rx_end = 0, got
                budget -= got
            if self._frame is not None:
                take = min(end - pos, self._left)
                if self._placing:
                    target = self._targets[0]
                    take = min(take, len(target))
                    target[:take] = self._rx_view[pos : pos + take]
                self._rx_pos = pos + take
                self._consume(take)
            elif not self._hdr_got and end - pos >= HEADER_SIZE:  # a whole header: no copy
                self._rx_pos = pos + HEADER_SIZE
                self._begin(wire.unpack_from(self._rx_view, pos))
            else:
                take = min(end - pos, HEADER_SIZE - self._hdr_got)
                self._hdr_view[self._hdr_got : self._hdr_got + take] = self._rx_view[pos : pos + take]
                self._rx_pos = pos + take
                self._hdr_got += take
                if self._hdr_got == HEADER_SIZE:
                    self._hdr_got = 0
                    self._begin(wire.unpack(self._hdr))

    def _stage(self) -> memoryview:
        """The buffer to read into: the engine's staging buffer, shared by its connections (reads run one at
        a time, under the engine lock, and _unstage keeps what is left), so an idle connection holds none;
        a thousand connections held 64 MiB before."""
        engine = self.engine
        if engine.staging_user in (None, self):
            engine.staging_user = self
            self._rx_view = engine.staging
        else:  # a read nested in another connection's: never seen, but it must not share the buffer
            self._rx_view = memoryview(bytearray(STAGING))
        return self._rx_view

    def _unstage(self) -> None:
        """Give the engine's staging buffer back, keeping a copy of any input not parsed yet (a read that
        used up its budget)."""
        engine = self.engine
        if engine.staging_user is not self:
            return
        engine.staging_user = None
        pos, end = self._rx_pos, self._rx_end
        self._rx_view = memoryview(bytes(self._rx_view[pos:end])) if pos < end else _NOTHING
        self._rx_pos, self._rx_end = 0, end - pos

    def _consume(self, got: int) -> None:
        """`got` payload bytes of the current frame have been placed (or dropped)."""
        if self._placing:
            targets = self._targets
            if got == len(targets[0]):
                del targets[0]
            else:
                targets[0] = targets[0][got:]
        self._left -= got
        if self._left == 0:
            self._end()

    def _recv(self, view: memoryview) -> int | None:
        """Bytes read into view; None when there is nothing more now (or the stream ended)."""
        try:
            got = self.sock.recv_into(view)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            self._broken(f"receive failed: {exc.strerror or exc}")
            return None
        if got == 0:
            self._broken("peer closed the connection")
            return None
        return got

    def _begin(self, hdr: wire.Header) -> None:
        reason = wire.problem(hdr)
        if reason is not None:
            self._broken(f"protocol error: {reason}")
            return
        self._frame = hdr
        self._left = left = wire.payload_length(hdr)
        targets = self.sink.on_header(self, hdr) if not self.closed else None
        placing = targets is not None and sum(map(len, targets)) == left
        pos = self._rx_pos
        if left <= self._rx_end - pos:  # the whole payload is staged already: place it and be done
            if placing:
                view = self._rx_view
                for target in targets or ():
                    size = len(target)
                    target[:] = view[pos : pos + size]
                    pos += size
            self._rx_pos = pos + (0 if placing else left)
            self._placing = placing
            self._end()
        elif placing:
            self._placing = True
            self._targets = [target for target in targets or () if len(target)]

    def _end(self) -> None:
        hdr, placed = self._frame, self._placing
        self._frame = None
        if placed:
            self._placing, self._targets = False, []
        if hdr is not None and not self.closed:
            self.sink.on_frame(self, hdr, placed)

    def _broken(self, reason: str) -> None:
        if not self.closed:
            self.close()
            self.sink.on_broken(self, reason)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.engine.unwatch(self.sock.fileno())
        self.sock.close()
        self._out.clear()
        self._cur = _NO_FRAME
