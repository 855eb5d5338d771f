/* libibverbs, opened with dlopen on first use (verbs_lib.c): the core is never linked against it, so a
 * host without rdma-core still imports libshift. Only the library's real functions are here; the data
 * path (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq) is verbs.h's inline calls through
 * the device context's ops, which need no symbol. */
#ifndef SHIFT_CORE_VERBS_LIB_H
#define SHIFT_CORE_VERBS_LIB_H

#include <infiniband/verbs.h>

struct sv_lib {
    struct ibv_device **(*get_device_list)(int *num);
    void (*free_device_list)(struct ibv_device **list);
    const char *(*get_device_name)(struct ibv_device *device);
    struct ibv_context *(*open_device)(struct ibv_device *device);
    int (*close_device)(struct ibv_context *context);
    int (*query_device)(struct ibv_context *context, struct ibv_device_attr *attr);
    int (*query_port)(struct ibv_context *context, uint8_t port, struct ibv_port_attr *attr);
    int (*query_gid)(struct ibv_context *context, uint8_t port, int index, union ibv_gid *gid);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *context);
    int (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access);
    int (*dereg_mr)(struct ibv_mr *mr);
    struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *context);
    int (*destroy_comp_channel)(struct ibv_comp_channel *channel);
    struct ibv_cq *(*create_cq)(struct ibv_context *context, int cqe, void *cq_context,
                                struct ibv_comp_channel *channel, int comp_vector);
    int (*destroy_cq)(struct ibv_cq *cq);
    int (*get_cq_event)(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context);
    void (*ack_cq_events)(struct ibv_cq *cq, unsigned int nevents);
    struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
    int (*query_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask, struct ibv_qp_init_attr *init);
    int (*destroy_qp)(struct ibv_qp *qp);
    int (*get_async_event)(struct ibv_context *context, struct ibv_async_event *event);
    void (*ack_async_event)(struct ibv_async_event *event);
};

/* The library's functions, or NULL with sv_error() saying why it cannot be had (loaded once a process). */
const struct sv_lib *sv_lib(void);

/* Sets this thread's sv_error() text (printf-style), errno untouched; returns NULL, for `return sv_fail(...)`. */
void *sv_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
