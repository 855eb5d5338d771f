/* How soon the core's own threads run when woken (priority.c). */
#ifndef SHIFT_CORE_PRIORITY_H
#define SHIFT_CORE_PRIORITY_H

#include <pthread.h>

#define SC_SHORT_SLICE_NS 100000 /* the kernel's least custom slice */

enum sc_priority {
    SC_PRIORITY_NONE = 0,     /* the kernel refused both: the thread runs as it was */
    SC_PRIORITY_SHORT = 1,    /* SCHED_OTHER with a slice of SC_SHORT_SLICE_NS */
    SC_PRIORITY_REALTIME = 2, /* SCHED_FIFO, priority 1 */
};

/* Give the calling thread, one that sleeps until an event and then does a short step of a failover, the
 * first of: SCHED_FIFO priority 1 (unless SHIFT_REALTIME=0; it needs CAP_SYS_NICE or an RLIMIT_RTPRIO),
 * a short slice. Says which it got. */
enum sc_priority sc_thread_prefer_latency(void);

/* A mutex that the core's threads share with the application's (a context's lock): a plain one, not
 * priority-inheriting (priority.c says why); recursive when asked. 0, or an errno. */
int sc_mutex_init(pthread_mutex_t *mutex, int recursive);

#endif
