/* A small persistent thread pool for the C kernels: plait_pool_run(fn, ctx, parts, threads)
 * calls fn(ctx, part, parts) for every part in [0, parts) on up to `threads` threads (the
 * calling one and pool workers, each claiming parts one at a time) and returns when all are
 * done.
 *
 * Built at first use by plait.kernels._native; kernels get plait_pool_run's address from Python
 * and call it directly. A Python ThreadPoolExecutor costs 10-40 us to hand a range to a thread,
 * more than a one-token matrix-vector product of a small model takes; here an idle worker spins
 * (pausing, yielding the core every few microseconds) for SPIN_NS after its last part, so back
 * to back calls reach it in about a microsecond, then sleeps on a condition variable. One call
 * runs at a time: a second caller meanwhile (another Python thread) runs all its parts itself.
 * After fork() the child starts without workers (they are not copied) and makes new ones. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>

#include "plait_kernels.h"

#define MAX_WORKERS 254 /* threads fit the ticket's low byte */
#define SPIN_NS 2000000L /* 2 ms: the gaps between a decode step's matmuls */
#define YIELD_EVERY 256  /* spin iterations between sched_yield() calls */

static struct {
    pthread_mutex_t call;  /* held for the whole of a call */
    pthread_mutex_t sleep; /* with wake: sleeping workers */
    pthread_cond_t wake;
    int workers;           /* started threads, numbered 1..workers */
    uint64_t ticket;       /* job generation << 8 | threads asked to help */
    uint64_t claim;        /* generation << 32 | parts << 16 | next unclaimed part */
    int completed;         /* parts of the current job finished */
    int sleepers;
    uint64_t spawn_ticket; /* the ticket before the job that started the newest workers */
    plait_part_fn fn;
    void *ctx;
    int hooked;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          0, 0, 0, 0, 0, 0, NULL, NULL, 0};

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000L + t.tv_nsec;
}

/* The next ticket after `seen`: spin first (when the worker just helped), then sleep. */
static uint64_t next_ticket(uint64_t seen, int spin) {
    if (spin) {
        int64_t until = now_ns() + SPIN_NS;
        for (long i = 1;; ++i) {
            uint64_t t = __atomic_load_n(&pool.ticket, __ATOMIC_SEQ_CST);
            if (t >> 8 != seen >> 8) return t;
            cpu_relax();
            if (i % YIELD_EVERY == 0) {
                if (now_ns() > until) break;
                sched_yield();
            }
        }
    }
    pthread_mutex_lock(&pool.sleep);
    __atomic_add_fetch(&pool.sleepers, 1, __ATOMIC_SEQ_CST);
    uint64_t t;
    while ((t = __atomic_load_n(&pool.ticket, __ATOMIC_SEQ_CST)) >> 8 == seen >> 8)
        pthread_cond_wait(&pool.wake, &pool.sleep);
    __atomic_sub_fetch(&pool.sleepers, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&pool.sleep);
    return t;
}

/* Claim and run parts of job `gen` until none is left. Parts are claimed one at a time, so a
 * thread that is slow to wake (or descheduled) leaves its share to the others: the caller
 * never waits for a part nobody has started. */
static void work(uint64_t gen) {
    uint64_t c = __atomic_load_n(&pool.claim, __ATOMIC_SEQ_CST);
    while (c >> 32 == gen && (c & 0xffff) < ((c >> 16) & 0xffff)) {
        if (!__atomic_compare_exchange_n(&pool.claim, &c, c + 1, 0, __ATOMIC_SEQ_CST,
                                         __ATOMIC_SEQ_CST))
            continue; /* c now holds the current value */
        /* fn and ctx stay put until every claimed part of this job has completed */
        pool.fn(pool.ctx, (int)(c & 0xffff), (int)((c >> 16) & 0xffff));
        __atomic_add_fetch(&pool.completed, 1, __ATOMIC_SEQ_CST);
        c = __atomic_load_n(&pool.claim, __ATOMIC_SEQ_CST);
    }
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    /* Not the current ticket: the job this worker was started for may be published already. */
    uint64_t seen = pool.spawn_ticket;
    int helped = 0;
    for (;;) {
        seen = next_ticket(seen, helped);
        helped = id < (int)(seen & 0xff);
        if (helped) work(seen >> 8);
    }
    return NULL;
}

static void reset_after_fork(void) {
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
    pool.call = fresh;
    pool.sleep = fresh;
    pool.wake = cond;
    pool.workers = 0;
    pool.sleepers = 0;
}

/* Start workers until threads - 1 exist; returns how many threads the pool has now. */
static int grow(int threads) {
    if (!pool.hooked) {
        pthread_atfork(NULL, NULL, reset_after_fork);
        pool.hooked = 1;
    }
    pool.spawn_ticket = __atomic_load_n(&pool.ticket, __ATOMIC_SEQ_CST);
    while (pool.workers < threads - 1) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&t, &attr, worker, (void *)(intptr_t)(pool.workers + 1));
        pthread_attr_destroy(&attr);
        if (failed) break;
        pool.workers++;
    }
    return pool.workers + 1 < threads ? pool.workers + 1 : threads;
}

/* Run fn(ctx, p, parts) for every p in [0, parts) on up to `threads` threads, this one
 * included, and return when all have run; returns the threads asked to help (1: this thread
 * alone, as while another call holds the pool). */
int plait_pool_run(plait_part_fn fn, void *ctx, int parts, int threads) {
    if (parts > 0xffff) return -1;
    if (threads > parts) threads = parts;
    if (threads > MAX_WORKERS + 1) threads = MAX_WORKERS + 1;
    if (threads <= 1 || pthread_mutex_trylock(&pool.call) != 0) {
        for (int p = 0; p < parts; ++p) fn(ctx, p, parts);
        return 1;
    }
    threads = grow(threads);
    uint64_t gen = (__atomic_load_n(&pool.ticket, __ATOMIC_SEQ_CST) >> 8) + 1;
    pool.fn = fn;
    pool.ctx = ctx;
    __atomic_store_n(&pool.completed, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&pool.claim, gen << 32 | (uint64_t)parts << 16, __ATOMIC_SEQ_CST);
    __atomic_store_n(&pool.ticket, gen << 8 | (uint64_t)threads, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&pool.sleepers, __ATOMIC_SEQ_CST) > 0) {
        pthread_mutex_lock(&pool.sleep);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.sleep);
    }
    work(gen);
    for (long i = 1; __atomic_load_n(&pool.completed, __ATOMIC_SEQ_CST) < parts; ++i) {
        cpu_relax();
        if (i % YIELD_EVERY == 0) sched_yield(); /* a helper may share this core */
    }
    pthread_mutex_unlock(&pool.call);
    return threads;
}
