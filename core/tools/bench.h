/* bench.h: the `kvgen bench` and `kvgen devices` subcommands (core/tools/bench_core.c,
 * bench_devices.c; bench_internal.h says how the bench's files divide the work).
 * Both take the whole argv of `kvgen` (argv[1] is the subcommand's name) and return the exit
 * status: 0 on success, 1 when kvgen reports an error, 2 on a usage error. */
#ifndef KVGEN_CLI_BENCH_H
#define KVGEN_CLI_BENCH_H

int kvgen_cli_bench(int argc, char **argv);
int kvgen_cli_devices(int argc, char **argv);

#endif
