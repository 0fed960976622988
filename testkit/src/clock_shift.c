/* A server's wall clock, shifted by an offset that a test moves while the server runs.
 *
 * Loaded into redis-server (or valkey-server) with LD_PRELOAD; LOCKSMITH_CLOCK_FILE names a
 * file of 8 bytes: the offset in microseconds, a little-endian signed integer, read through a
 * shared mapping on every call, so a write to the file steps the clock at once. It shifts
 * CLOCK_REALTIME (and its coarse form) as clock_gettime, gettimeofday and time report it;
 * the monotonic clocks are left alone, as a real step of the wall clock leaves them.
 *
 * The real clock is read with the raw system call, never through dlsym or malloc: the server's
 * allocator (jemalloc) reads the clock while it starts, before any constructor ran. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile int64_t *offset_us;
static int state; /* 0: not opened yet, 1: opened (offset_us may still be NULL) */

static int64_t offset(void) {
    if (!__atomic_load_n(&state, __ATOMIC_ACQUIRE)) {
        const char *path = getenv("LOCKSMITH_CLOCK_FILE");
        if (path) {
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd >= 0) {
                void *p = mmap(NULL, 8, PROT_READ, MAP_SHARED, fd, 0);
                if (p != MAP_FAILED) {
                    __atomic_store_n(&offset_us, (int64_t *)p, __ATOMIC_RELEASE);
                }
                close(fd);
            }
        }
        __atomic_store_n(&state, 1, __ATOMIC_RELEASE);
    }
    volatile int64_t *p = __atomic_load_n(&offset_us, __ATOMIC_ACQUIRE);
    return p ? __atomic_load_n(p, __ATOMIC_RELAXED) : 0;
}

static void shift(struct timespec *ts) {
    int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + offset() * 1000;
    ts->tv_sec = ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += 1000000000;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int r = (int)syscall(SYS_clock_gettime, id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        shift(ts);
    }
    return r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    int r = clock_gettime(CLOCK_REALTIME, &ts);
    if (r == 0 && tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return r;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}
