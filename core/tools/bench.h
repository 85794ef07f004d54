/* bench.h: the `kvgen bench` and `kvgen devices` subcommands (core/tools/bench.c).
 * Both take the whole argv of `kvgen` (argv[1] is the subcommand's name) and return the exit
 * status: 0 on success, 1 when kvgen reports an error, 2 on a usage error. */
#ifndef KVGEN_CLI_BENCH_H
#define KVGEN_CLI_BENCH_H

int kvgen_cli_bench(int argc, char **argv);
int kvgen_cli_devices(int argc, char **argv);

/* The load-progress line on stderr (kvgen_cli.c): kvgen_cli_progress() is the callback for
 * kvgen_model_desc.progress when stderr is a terminal, NULL otherwise; kvgen_cli_progress_end()
 * clears the line after the load. */
#include "kvgen.h"
kvgen_load_progress_fn kvgen_cli_progress(void);
void kvgen_cli_progress_end(void);

#endif
