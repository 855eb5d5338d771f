/* An LD_PRELOAD shim for tests/core/test_verbs_face.py: dlopen of libibverbs fails, as on a host without
 * rdma-core; every other dlopen is the real one. */
#include <dlfcn.h>
#include <string.h>

void *dlopen(const char *file, int mode) {
    static void *(*real)(const char *, int);
    if (file && strstr(file, "libibverbs")) return NULL;
    if (!real) {
        void *sym = dlsym(RTLD_NEXT, "dlopen");
        memcpy(&real, &sym, sizeof sym);
    }
    return real(file, mode);
}
