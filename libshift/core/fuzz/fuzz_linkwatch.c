/* libFuzzer target: any datagram into the link watch's parser (linkwatch.c), as if the kernel had sent it.
 * Built with clang -fsanitize=fuzzer,address,undefined by tests/core/test_core_fuzz.py. The datagram is an
 * exact-size copy, so a read past its end is ASan's to report; whatever it holds, the parser returns only
 * events of watched links, at most as many as asked for, never both up and removed. */
#include <stdlib.h>
#include <string.h>

#include "../linkwatch.h"

#define MAX_EVENTS 8

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const struct sc_link watched[] = {{0, 1}, {0, 2}, {0, 3}, {0, 7}};
    struct sc_link_event events[MAX_EVENTS];
    uint8_t *exact = malloc(size ? size : 1);
    if (!exact)
        return 0;
    memcpy(exact, data, size);
    int n = sc_link_parse(exact, size, 0, watched, 4, events, MAX_EVENTS);
    free(exact);
    if (n < 0 || n > MAX_EVENTS)
        abort();
    for (int i = 0; i < n; i++) {
        int known = 0;
        for (int j = 0; j < 4; j++)
            known |= events[i].ifindex == watched[j].ifindex;
        if (!known || events[i].source != 0 || events[i].up > 1 || events[i].gone > 1 ||
            (events[i].up && events[i].gone))
            abort();
    }
    return 0;
}
