/* pace.c - the modelled device of pace.h. */
#include "pace.h"

#include "clock.h"

void kvs_pace_init(kvs_pace *p) {
    pthread_mutex_init(&p->lock, NULL);
    p->busy_until_ns = 0;
}

void kvs_pace_destroy(kvs_pace *p) {
    pthread_mutex_destroy(&p->lock);
}

uint64_t kvs_pace_cost_ns(uint64_t bytes, uint64_t bytes_per_s, uint64_t per_op_ns) {
    uint64_t cost = per_op_ns;
    if (bytes_per_s) cost += (uint64_t)((unsigned __int128)bytes * 1000000000ull / bytes_per_s);
    return cost;
}

void kvs_pace_wait(kvs_pace *p, uint64_t start_ns, uint64_t cost_ns) {
    pthread_mutex_lock(&p->lock);
    uint64_t start = p->busy_until_ns > start_ns ? p->busy_until_ns : start_ns;
    p->busy_until_ns = start + cost_ns;
    uint64_t until = p->busy_until_ns;
    pthread_mutex_unlock(&p->lock);
    kvs_sleep_until_ns(until);
}
