/* kvg_worker.h: the jobs worker's helpers for tools and tests (private; the jobs API itself is
 * public, in kvgen.h, and the hooks sessions and the model call are in kvg_session.h). */
#ifndef KVG_WORKER_H
#define KVG_WORKER_H
#include "kvgen.h"

/* Aggregate decode throughput with n_sessions generating at once through the worker: each
 * gets a fresh session, the same prompt tokens (BOS, or token 1) and n_tokens greedy tokens
 * with end-of-generation ignored. *tokens_per_s = all generated tokens / (last job's end -
 * first job's first token), so prefill is mostly outside the window. Blocks until done
 * (a benchmark, not for a frame loop). */
kvgen_status kvg_jobs_bench(kvgen_model *m, int n_sessions, int n_tokens, double *tokens_per_s,
                            kvgen_error *err);

#endif
