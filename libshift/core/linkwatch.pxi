# The core's link watch (linkwatch.h): rtnetlink's link messages on sockets the caller opened, read in C.

from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

DEF LINK_EVENTS = 64
DEF LINK_SOCKETS = 63  # and the wake-up's eventfd: sc_link_wait looks at 64 fds


PRIORITIES = ("none", "short slice", "realtime")


def prefer_latency():
    """The calling thread runs at once when woken (priority.h): 'realtime' (SCHED_FIFO 1), 'short slice'
    (where real time is not allowed, or SHIFT_REALTIME=0), or 'none' (the kernel refused both)."""
    return PRIORITIES[lw.sc_thread_prefer_latency()]


def link_next(fds, int wake, watched, int timeout_ms=-1):
    """Wait up to timeout_ms (-1: forever) for the non-blocking NETLINK_ROUTE sockets `fds` (at most 63) or
    the eventfd `wake`, read every link message that came about the watched links, and raise the mark of
    each one seen down, all without the interpreter lock: a mark's `act` (FastContext.link_mark: the fast
    path's switch) is called here, after the bits, while this thread may then wait milliseconds for the
    lock. `watched`: (source, ifindex, mark) each, source the socket's place in `fds`, mark (word address,
    bit, act address, its argument) or None. Returns (woken, events, errors, seen_ns): events (source,
    ifindex, up, gone); errors (source, errno) of the sockets whose read failed (ENOBUFS: the kernel
    dropped messages, ask the links' state again); seen_ns, CLOCK_MONOTONIC when the wait ended."""
    cdef int n = min(len(fds), LINK_SOCKETS)
    cdef int count = len(watched)
    cdef int polled[LINK_SOCKETS + 1]
    cdef int failed[LINK_SOCKETS]
    cdef lw.sc_link *links = <lw.sc_link *>malloc(max(count, 1) * sizeof(lw.sc_link))
    cdef lw.sc_link_mark *marks = <lw.sc_link_mark *>malloc(max(count, 1) * sizeof(lw.sc_link_mark))
    cdef lw.sc_link_event *events = <lw.sc_link_event *>malloc(max(n, 1) * LINK_EVENTS * sizeof(lw.sc_link_event))
    cdef int64_t ready
    cdef timespec seen
    cdef int i, got, total = 0
    try:
        if links is NULL or marks is NULL or events is NULL:
            raise MemoryError()
        for i in range(n):
            polled[i] = fds[i]
            failed[i] = 0
        polled[n] = wake
        for i, (source, ifindex, mark) in enumerate(watched):
            links[i].source, links[i].ifindex = source, ifindex
            word, bit, act, arg = mark or (0, 0, 0, 0)
            marks[i].word, marks[i].bit = <uint32_t *><uintptr_t>word, bit
            marks[i].act, marks[i].arg = <void (*)(void *) noexcept nogil><uintptr_t>act, <void *><uintptr_t>arg
        with nogil:
            ready = lw.sc_link_wait(polled, n + 1, timeout_ms)
            clock_gettime(CLOCK_MONOTONIC, &seen)
            for i in range(n):
                if ready > 0 and ready >> i & 1:
                    got = lw.sc_link_read(polled[i], i, links, count, events + total, LINK_EVENTS)
                    if got < 0:
                        failed[i] = errno
                    else:
                        lw.sc_link_raise(events + total, got, links, marks, count)
                        total += got
        if ready < 0:
            raise OSError(errno, "poll of the link watch's sockets failed")
        woken = ready > 0 and bool(ready >> n & 1)
        found = [(events[i].source, events[i].ifindex, bool(events[i].up), bool(events[i].gone))
                 for i in range(total)]
        seen_ns = seen.tv_sec * 1_000_000_000 + seen.tv_nsec
        return woken, found, [(i, failed[i]) for i in range(n) if failed[i]], seen_ns
    finally:
        free(links)
        free(marks)
        free(events)
