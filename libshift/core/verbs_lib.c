/* Loading libibverbs at run time: dlopen of its soname, then every function sv_lib names, once. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "verbs_core.h"
#include "verbs_lib.h"

#define SV_SONAME "libibverbs.so.1"

static _Thread_local char error_text[256];
static struct sv_lib lib;
static const struct sv_lib *loaded;
static char load_error[256];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static const struct {
    const char *name;
    size_t offset;
} symbols[] = {
#define SYM(field) {"ibv_" #field, offsetof(struct sv_lib, field)}
    SYM(get_device_list), SYM(free_device_list), SYM(get_device_name), SYM(open_device),
    SYM(close_device), SYM(query_device), SYM(query_port), SYM(query_gid), SYM(alloc_pd),
    SYM(dealloc_pd), SYM(reg_mr), SYM(dereg_mr), SYM(create_comp_channel), SYM(destroy_comp_channel),
    SYM(create_cq), SYM(destroy_cq), SYM(get_cq_event), SYM(ack_cq_events), SYM(create_qp),
    SYM(modify_qp), SYM(query_qp), SYM(destroy_qp), SYM(get_async_event), SYM(ack_async_event),
#undef SYM
};

const char *sv_error(void) { return error_text; }

void *sv_fail(const char *fmt, ...) {
    int saved = errno; /* the caller's errno is the failure's: formatting must not change it */
    va_list args;
    va_start(args, fmt);
    vsnprintf(error_text, sizeof error_text, fmt, args);
    va_end(args);
    errno = saved;
    return NULL;
}

static void load(void) {
    void *handle = dlopen(SV_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char *why = dlerror();
        snprintf(load_error, sizeof load_error, "%s cannot be loaded (is rdma-core installed?): %s", SV_SONAME,
                 why ? why : "not found");
        return;
    }
    for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++) {
        void *fn = dlsym(handle, symbols[i].name);
        if (!fn) {
            snprintf(load_error, sizeof load_error, "%s has no %s: %s", SV_SONAME, symbols[i].name, dlerror());
            dlclose(handle);
            return;
        }
        /* POSIX: a function's address may pass through a void * (dlsym's own contract) */
        memcpy((char *)&lib + symbols[i].offset, &fn, sizeof fn);
    }
    loaded = &lib; /* the handle stays open for the process's life: its providers' objects live in it */
}

const struct sv_lib *sv_lib(void) {
    pthread_once(&once, load);
    if (!loaded) sv_fail("%s", load_error);
    return loaded;
}

int sv_available(void) { return sv_lib() != NULL; }
