/* metrics_render.h - the Prometheus text (format 0.0.4) of one metrics segment: every slot summed
 * by label set (docs/operations.md, Metrics). */
#ifndef KVS_METRICS_RENDER_H
#define KVS_METRICS_RENDER_H

#include <stddef.h>

#include "metrics_seg.h"

/* malloc'd text into *text (free()), its length in *len. KVS_ENOMEM, or KVS_EAGAIN when the segment
 * kept changing under every copy. */
kvs_status kvs_metrics_render_seg(kvs_mseg *seg, char **text, size_t *len);
/* The same from slots already copied (tests). */
kvs_status kvs_metrics_render_slots(const kvs_mseg_slot *slots, uint32_t n, uint32_t processes,
                                    char **text, size_t *len);

#endif
