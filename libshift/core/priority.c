/* The core's own threads (each context's progress thread, the link watch) play the part of an RNIC's
 * hardware: a frame or a link message comes, and what the thread does then is the next step of a
 * failover. Under the kernel's fair scheduler a woken thread waits for a CPU until the task there has had
 * its slice (1.4 ms on 2 CPUs; measured here, 0.4-0.9 ms a step, several steps a failover), and it is
 * queued behind the CPU it was woken from while another one sits idle between a busy poller's short
 * sleeps. SCHED_FIFO at the lowest priority runs it at once on the CPU with the least important task,
 * as the kernel's own interrupt threads run. Each step is short: the thread waits in epoll or recv, and
 * a caller's blocking wait moves bulk data itself; the kernel still keeps 5% of each CPU for the rest.
 * Where that is not allowed (no CAP_SYS_NICE, a container), or SHIFT_REALTIME=0 says not to, the thread
 * asks for the least slice instead (Linux 6.12+: it preempts on waking, with the same share of CPU).
 *
 * A context's lock is taken by both: by a busy poll on the application's thread, by the link watch or a
 * progress thread for a failover's step. It is a plain mutex. A priority-inheriting one (session 25) ran the
 * holder at the waiter's priority, which once ended a 466 us wait of the link watch for a poller it had
 * preempted; but the kernel's rt_mutex behind it makes every contended lock and unlock a system call and
 * has a real-time waiter spin while the holder runs, and on 2 CPUs a progress thread spinning so kept the
 * application's thread from the CPU for 0.4 ms at a time during a failover. Measured in alternating runs
 * (bench/failover_downtime.py, 20 trials each, 4 pairs): median WRITE 0.90-1.27 ms plain against
 * 1.16-1.68 inheriting, SEND 1.41-1.78 against 1.43-2.15. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "priority.h"

struct sched_attr_v0 { /* the kernel's struct sched_attr, first version (48 bytes) */
    uint32_t size, policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime, deadline, period;
};

enum { POLICY_OTHER = 0, POLICY_FIFO = 1 };

static int set(const struct sched_attr_v0 *attr) { return (int)syscall(SYS_sched_setattr, 0, attr, 0); }

static int realtime_wanted(void) {
    const char *value = getenv("SHIFT_REALTIME");
    return !value || strcmp(value, "0") != 0;
}

int sc_mutex_init(pthread_mutex_t *mutex, int recursive) {
    pthread_mutexattr_t attr;
    int failed = pthread_mutexattr_init(&attr);
    if (failed) return failed;
    if (recursive) pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    failed = pthread_mutex_init(mutex, &attr);
    pthread_mutexattr_destroy(&attr);
    return failed;
}

enum sc_priority sc_thread_prefer_latency(void) {
    if (realtime_wanted()) {
        struct sched_attr_v0 fifo = {.size = sizeof fifo, .policy = POLICY_FIFO, .priority = 1};
        if (set(&fifo) == 0) return SC_PRIORITY_REALTIME;
    }
    errno = 0;
    int nice = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid)); /* kept: the call sets it too */
    if (errno) return SC_PRIORITY_NONE;
    struct sched_attr_v0 other = {
        .size = sizeof other, .policy = POLICY_OTHER, .nice = nice, .runtime = SC_SHORT_SLICE_NS};
    return set(&other) == 0 ? SC_PRIORITY_SHORT : SC_PRIORITY_NONE;
}
