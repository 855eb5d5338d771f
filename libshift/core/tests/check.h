/* The C unit tests' one check: it counts, and on a failure says where and what failed, with CHECK_DETAIL
 * when the test defines it before this include (a string expression: the verbs backend's last error). */
#ifndef SHIFT_TESTS_CHECK_H
#define SHIFT_TESTS_CHECK_H

#include <stdio.h>

#ifndef CHECK_DETAIL
#define CHECK_DETAIL ""
#endif

static int passed, failed;

#define CHECK(cond)                                                                                  \
    do {                                                                                             \
        if (cond) passed++;                                                                          \
        else {                                                                                       \
            failed++;                                                                                \
            fprintf(stderr, "%s:%d: %s: check failed: %s %s\n", __FILE__, __LINE__, __func__, #cond, \
                    CHECK_DETAIL);                                                                   \
        }                                                                                            \
    } while (0)

#endif
