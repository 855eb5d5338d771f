# The core's link watch (linkwatch.h), as Cython sees it.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t


cdef extern from "linkwatch.h" nogil:
    struct sc_link:
        int32_t source, ifindex
    struct sc_link_event:
        int32_t source, ifindex
        uint8_t up, gone
    struct sc_link_mark:
        uint32_t *word
        uint32_t bit
        void (*act)(void *arg)
        void *arg
    int64_t sc_link_wait(const int *fds, int nfds, int timeout_ms)
    int sc_link_read(int fd, int32_t source, const sc_link *watched, int nwatched, sc_link_event *out, int max)
    void sc_link_raise(const sc_link_event *events, int n, const sc_link *watched, const sc_link_mark *marks,
                       int nwatched)


cdef extern from "priority.h" nogil:
    int sc_thread_prefer_latency()
