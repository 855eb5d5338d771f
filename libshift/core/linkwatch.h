/* The links of a context's netdevs as the kernel reports them (rtnetlink, RTMGRP_LINK): the core's own NIC
 * event source (DESIGN 4b), faster than shiftd's word by the daemon's hop and the agent's gRPC stream.
 * The caller opens the NETLINK_ROUTE sockets (in each netdev's namespace: an ifindex means something only
 * there) and names what to watch as (source, ifindex): source is the socket's place in the caller's list. */
#ifndef SHIFT_CORE_LINKWATCH_H
#define SHIFT_CORE_LINKWATCH_H

#include <stddef.h>
#include <stdint.h>

#define SC_LINK_BUFFER 32768 /* one datagram of the kernel's: several link messages at most */

struct sc_link {
    int32_t source, ifindex;
};

struct sc_link_event {
    int32_t source, ifindex;
    uint8_t up;   /* IFF_UP with carrier (IFF_LOWER_UP), and an operstate that carries traffic */
    uint8_t gone; /* RTM_DELLINK: the netdev was removed */
};

/* What a watched link raises when it is seen down: bit `bit` of the word at `word`, set atomically from the
 * watch's thread for whoever acts on it (the fast path's next pass: fastpath.h's sf_ctx_link_word). */
struct sc_link_mark {
    uint32_t *word; /* NULL: nothing to raise */
    uint32_t bit;
    void (*act)(void *arg); /* called once per raise (per distinct arg), after the bits: NULL for none */
    void *arg;
};

/* The events of one datagram read from `source` for the watched links, at most max of them; a malformed
 * message ends the parse (what follows it cannot be framed), and nothing is read past len. */
int sc_link_parse(const uint8_t *buf, size_t len, int32_t source, const struct sc_link *watched, int nwatched,
                  struct sc_link_event *out, int max);

/* Wait up to timeout_ms (-1: forever) for any of fds to be readable: a bit per readable fd (fds beyond 63
 * are not looked at), 0 on timeout, -1 with errno. Blocks: call it without the interpreter lock. */
int64_t sc_link_wait(const int *fds, int nfds, int timeout_ms);

/* Every datagram waiting on the non-blocking socket fd (`source`), parsed: the number of events, or -1 with
 * errno (ENOBUFS: the kernel dropped messages, the state must be asked again). Datagrams not from the
 * kernel are dropped unread. */
int sc_link_read(int fd, int32_t source, const struct sc_link *watched, int nwatched, struct sc_link_event *out,
                 int max);

/* Raise the mark of every watched link (watched[i] has marks[i]) that `events` say is down or gone, then
 * call the `act` of each raised mark once per distinct arg, on the caller's thread. */
void sc_link_raise(const struct sc_link_event *events, int n, const struct sc_link *watched,
                   const struct sc_link_mark *marks, int nwatched);

#endif
