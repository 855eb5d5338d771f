/* TCP's view of a path, for the ack deadline: the signal an RNIC's per-packet ACKs give its retry timer.
 *
 * The responder acks a request once its process has placed it, which a busy remote host can delay past a
 * short deadline. The remote kernel's TCP acks are the packet-level signal: while it keeps acknowledging
 * new bytes, or has none of ours left to acknowledge, or holds its window shut and answers our window
 * probes, the path is alive and the wait is on the remote host. A black hole or a dead link shows none.
 */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include "internal.h"

#define INFO_LEN 232 /* struct tcp_info up to tcpi_snd_wnd (Linux 5.4); older kernels return less */
#define PROBES_AT 3  /* u8 tcpi_probes: unanswered zero-window probes */
#define BYTES_ACKED_AT 120
#define SND_WND_AT 228

void sc_path_reset(struct sc_path *path) { path->have_mark = 0; }

int sc_path_alive(struct sc_path *path, int fd) {
    int unacked = 0;
    uint8_t info[INFO_LEN];
    socklen_t len = sizeof info;
    memset(info, 0, sizeof info);
    if (ioctl(fd, TIOCOUTQ, &unacked) < 0 || getsockopt(fd, IPPROTO_TCP, TCP_INFO, info, &len) < 0) return 0;
    if (unacked == 0) return 1; /* everything we wrote is acknowledged */
    uint32_t snd_wnd = 0;
    if (len >= INFO_LEN) memcpy(&snd_wnd, info + SND_WND_AT, sizeof snd_wnd);
    if (len >= INFO_LEN && snd_wnd == 0 && info[PROBES_AT] == 0) return 1;
    if (len < BYTES_ACKED_AT + 8) return 0; /* no tcpi_bytes_acked: only the verbs-level acks count */
    uint64_t acked;
    memcpy(&acked, info + BYTES_ACKED_AT, sizeof acked);
    int had = path->have_mark;
    uint64_t mark = path->mark;
    path->have_mark = 1;
    path->mark = acked;
    if (!had) return -1;
    return acked > mark;
}
