/* The links of the netdevs a context uses, from rtnetlink's link messages (linkwatch.h). Nothing here trusts
 * a length: every header is copied out (a datagram need not be aligned for the fuzzer) and checked against
 * what is left of the buffer before anything behind it is read. */
#include "linkwatch.h"

#include <errno.h>
#include <linux/if.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

static int is_watched(const struct sc_link *watched, int nwatched, int32_t source, int32_t ifindex) {
    for (int i = 0; i < nwatched; i++)
        if (watched[i].source == source && watched[i].ifindex == ifindex)
            return 1;
    return 0;
}

/* IFLA_OPERSTATE among the attributes at `at`, or -1 when they do not say (or cannot be walked). */
static int operstate_of(const uint8_t *at, size_t len) {
    while (len >= sizeof(struct rtattr)) {
        struct rtattr rta;
        memcpy(&rta, at, sizeof rta);
        if (rta.rta_len < sizeof rta || rta.rta_len > len)
            return -1;
        if (rta.rta_type == IFLA_OPERSTATE && rta.rta_len > sizeof rta)
            return at[sizeof rta];
        size_t step = RTA_ALIGN(rta.rta_len);
        if (step >= len)
            return -1;
        at += step;
        len -= step;
    }
    return -1;
}

/* Up: administratively up with carrier, and an operstate (when the kernel gives one) that carries traffic.
 * A veth whose peer is down, a cable pulled, a switch port shut: IFF_LOWER_UP goes first. */
static int carries_traffic(uint32_t flags, int operstate) {
    if (!(flags & IFF_UP) || !(flags & IFF_LOWER_UP))
        return 0;
    return operstate < 0 || operstate == IF_OPER_UP || operstate == IF_OPER_UNKNOWN;
}

int sc_link_parse(const uint8_t *buf, size_t len, int32_t source, const struct sc_link *watched, int nwatched,
                  struct sc_link_event *out, int max) {
    int n = 0;
    while (len >= sizeof(struct nlmsghdr) && n < max) {
        struct nlmsghdr hdr;
        memcpy(&hdr, buf, sizeof hdr);
        if (hdr.nlmsg_len < sizeof hdr || hdr.nlmsg_len > len)
            break;
        int link = hdr.nlmsg_type == RTM_NEWLINK || hdr.nlmsg_type == RTM_DELLINK;
        size_t body = NLMSG_LENGTH(sizeof(struct ifinfomsg));
        if (link && hdr.nlmsg_len >= body) {
            struct ifinfomsg ifi;
            memcpy(&ifi, buf + NLMSG_HDRLEN, sizeof ifi);
            if (is_watched(watched, nwatched, source, ifi.ifi_index)) {
                int gone = hdr.nlmsg_type == RTM_DELLINK;
                int operstate = operstate_of(buf + body, hdr.nlmsg_len - body);
                out[n++] = (struct sc_link_event){
                    .source = source,
                    .ifindex = ifi.ifi_index,
                    .up = (uint8_t)(!gone && carries_traffic(ifi.ifi_flags, operstate)),
                    .gone = (uint8_t)gone,
                };
            }
        }
        size_t step = NLMSG_ALIGN(hdr.nlmsg_len);
        if (step >= len)
            break;
        buf += step;
        len -= step;
    }
    return n;
}

int64_t sc_link_wait(const int *fds, int nfds, int timeout_ms) {
    struct pollfd polled[64];
    int n = nfds < 64 ? nfds : 64;
    for (int i = 0; i < n; i++)
        polled[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
    int got = poll(polled, (nfds_t)n, timeout_ms);
    if (got <= 0)
        return got;
    int64_t ready = 0;
    for (int i = 0; i < n; i++)
        if (polled[i].revents)
            ready |= (int64_t)1 << i;
    return ready;
}

int sc_link_read(int fd, int32_t source, const struct sc_link *watched, int nwatched, struct sc_link_event *out,
                 int max) {
    static _Thread_local uint8_t buf[SC_LINK_BUFFER] __attribute__((aligned(8)));
    int n = 0;
    while (n < max) {
        struct sockaddr_nl from;
        socklen_t from_len = sizeof from;
        ssize_t got = recvfrom(fd, buf, sizeof buf, MSG_DONTWAIT, (struct sockaddr *)&from, &from_len);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? n : -1;
        }
        if (from_len != sizeof from || from.nl_family != AF_NETLINK || from.nl_pid != 0)
            continue; /* not the kernel's */
        n += sc_link_parse(buf, (size_t)got, source, watched, nwatched, out + n, max - n);
    }
    return n;
}

void sc_link_raise(const struct sc_link_event *events, int n, const struct sc_link *watched,
                   const struct sc_link_mark *marks, int nwatched) {
    const struct sc_link_mark *raised[64];
    int count = 0;
    for (int e = 0; e < n; e++)
        for (int i = 0; !events[e].up && i < nwatched; i++) {
            const struct sc_link_mark *mark = &marks[i];
            if (!mark->word || watched[i].source != events[e].source || watched[i].ifindex != events[e].ifindex)
                continue;
            __atomic_fetch_or(mark->word, 1u << mark->bit, __ATOMIC_RELEASE);
            int known = 0;
            for (int k = 0; k < count; k++)
                known |= raised[k]->act == mark->act && raised[k]->arg == mark->arg;
            if (!known && mark->act && count < 64)
                raised[count++] = mark;
        }
    for (int k = 0; k < count; k++)
        raised[k]->act(raised[k]->arg);
}
