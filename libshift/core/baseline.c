/* Plain TCP on a connected socket, with none of the core: shift-perf's baselines, in C so that they
 * measure the machine's TCP and not the interpreter (as qperf and iperf3 do). The socket is blocking. */
#include <errno.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "internal.h"

/* All len bytes, or -1. */
static int send_all(int fd, const uint8_t *buf, size_t len) {
    while (len) {
        ssize_t sent = send(fd, buf, len, MSG_NOSIGNAL);
        if (sent < 0 && errno == EINTR) continue;
        if (sent <= 0) return -1;
        buf += sent;
        len -= (size_t)sent;
    }
    return 0;
}

/* Exactly len bytes, or -1 (an error, or the stream ended). */
static int recv_all(int fd, uint8_t *buf, size_t len) {
    while (len) {
        ssize_t got = recv(fd, buf, len, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return -1;
        buf += got;
        len -= (size_t)got;
    }
    return 0;
}

double sc_raw_pingpong(int fd, uint32_t size, uint32_t iters, int first) {
    uint8_t *buf = calloc(size ? size : 1, 1);
    if (!buf) return -1;
    int64_t start = sc_now();
    int failed = 0;
    for (uint32_t i = 0; i < iters && !failed; i++) {
        if (first) failed = send_all(fd, buf, size);
        if (!failed) failed = recv_all(fd, buf, size);
        if (!failed && !first) failed = send_all(fd, buf, size);
    }
    int64_t took = sc_now() - start;
    free(buf);
    return failed || !iters ? -1 : (double)took / 1e9 / (2.0 * iters);
}

double sc_raw_stream(int fd, uint64_t total, uint32_t chunk, int sending) {
    uint8_t *buf = calloc(chunk ? chunk : 1, 1);
    if (!buf || !chunk) {
        free(buf);
        return -1;
    }
    int64_t start = sc_now();
    int failed = 0;
    if (sending) { /* then the receiver's one byte: the bytes have all arrived */
        for (uint64_t left = total; left && !failed; left -= left < chunk ? left : chunk)
            failed = send_all(fd, buf, left < chunk ? left : chunk);
        if (!failed) failed = recv_all(fd, buf, 1);
    } else {
        for (uint64_t left = total; left && !failed;) {
            ssize_t got = recv(fd, buf, left < chunk ? left : chunk, 0);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) failed = 1;
            else left -= (uint64_t)got;
        }
        if (!failed) failed = send_all(fd, buf, 1);
    }
    int64_t took = sc_now() - start;
    free(buf);
    return failed || took <= 0 ? -1 : (double)total * 1e9 / (double)took;
}
