/* What the C loops of diloco.wire.native share: bit casts and the split of a call across threads. */
#ifndef DILOCO_NATIVE_COMMON_H
#define DILOCO_NATIVE_COMMON_H
#include <stdint.h>
#include <string.h>
#include <math.h>

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* The entry points Python calls: each splits its blocks (or values) into one range a thread, on the OpenMP
 * runtime torch itself runs on (libgomp, loaded once per process), so its threads and these do not compete.
 * Like torch's own parallel loops, they hang in a child forked after a parallel region unless it runs one thread
 * (torch.set_num_threads(1), as DataLoader workers do). */
#define SPLIT(total, nt, CALL)                                                                             \
    if (nt == 1) {  /* no OpenMP at all: a forked child with one thread works, as torch's own ops do */    \
        const int t = 0;                                                                                   \
        int64_t lo_ = 0, hi_ = (total);                                                                    \
        CALL;                                                                                              \
    } else {                                                                                               \
        _Pragma("omp parallel for num_threads(nt) schedule(static)")                                      \
        for (int t = 0; t < nt; t++) {                                                                     \
            int64_t lo_ = (total) * t / nt, hi_ = (total) * (t + 1) / nt;                                  \
            CALL;                                                                                          \
        }                                                                                                  \
    }

#endif
