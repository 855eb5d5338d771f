# The core's link watch (linkwatch.h): rtnetlink's link messages on sockets the caller opened, read in C.

DEF LINK_EVENTS = 64
DEF LINK_SOCKETS = 64


def link_wait(fds, int timeout_ms):
    """Wait, without the interpreter lock, up to timeout_ms (-1: forever) for any of `fds` (at most 64) to
    be readable: the indices of those that are, empty on timeout."""
    cdef int polled[LINK_SOCKETS]
    cdef int n = min(len(fds), LINK_SOCKETS)
    cdef int64_t ready
    for i in range(n):
        polled[i] = fds[i]
    with nogil:
        ready = lw.sc_link_wait(polled, n, timeout_ms)
    if ready < 0:
        raise OSError(errno, "poll of the link watch's sockets failed")
    return [i for i in range(n) if ready >> i & 1]


def link_read(int fd, int source, watched):
    """Every link message waiting on the non-blocking NETLINK_ROUTE socket `fd` (the `source`-th socket)
    about the watched (source, ifindex) pairs: a list of (source, ifindex, up, gone). OSError ENOBUFS says the
    kernel dropped messages (ask the links' state again)."""
    cdef lw.sc_link_event events[LINK_EVENTS]
    cdef int count = len(watched)
    cdef lw.sc_link *links = <lw.sc_link *>malloc(max(count, 1) * sizeof(lw.sc_link))
    cdef int got
    if links is NULL:
        raise MemoryError()
    try:
        for i, (src, ifindex) in enumerate(watched):
            links[i].source, links[i].ifindex = src, ifindex
        got = lw.sc_link_read(fd, source, links, count, events, LINK_EVENTS)
        if got < 0:
            raise OSError(errno, "reading the link watch's socket failed")
        return [(events[i].source, events[i].ifindex, bool(events[i].up), bool(events[i].gone))
                for i in range(got)]
    finally:
        free(links)
