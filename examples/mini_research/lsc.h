/* lsc.h - the mini engine's layer stream cache (--lsc, docs/peer_gpu.md): one long request whose
 * KV outgrows the engine's own page budget, the rest held in stream blocks of memory a peer lends
 * (engine ABI 1.8), fetched into a one- or two-buffer layer stream a layer at a time. It plans the
 * split with SwiftCache's Eq. 4-5, grows the request until its allocator is full (the measured
 * maximum context), and checks every step's logits bit for bit against the same request with all
 * its KV local, timing prefill and decode on both. */
#ifndef MINI_LSC_H
#define MINI_LSC_H

#include "models/mini/model.h"
#include "research.h"

/* 0 when the measured maximum context is within one stream block of the prediction and (with
 * --verify) every step matched; 1 otherwise (a sentence on stderr). */
int lsc_run(const options *o, const research *x, const model *m);

#endif
