/* plan_state.h - what a handle holds for restore plans (the restore planner, restore.c): the
 * engine's plan caps and stages and the planner's coefficients. A part of the handle (handle.h)
 * that this extension owns. */
#ifndef KVS_PLAN_STATE_H
#define KVS_PLAN_STATE_H

#include <stdint.h>

#include "schedulers/cacheflow/cacheflow.h"

typedef struct kvs_plan_state {
    uint32_t plan_caps; /* set_plan_caps */
    int restore_on;     /* restore.scheduler is cacheflow */
    cf_params restore_params;
    cf_compute restore_compute;
    cf_channel restore_channels[CF_MAX_CHANNELS]; /* per tier of the chain, from the profile */
    cf_stages stages;                             /* set_stages (n_stages 0: none) */
} kvs_plan_state;

#endif
