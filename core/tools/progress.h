/* progress.h: the load-progress line on stderr, shared by the kvgen command's subcommands
 * (core/tools/progress.c). kvgen_cli_progress() is the callback for kvgen_model_desc.progress
 * when stderr is a terminal, NULL otherwise; kvgen_cli_progress_end() clears the line after the
 * load. */
#ifndef KVGEN_CLI_PROGRESS_H
#define KVGEN_CLI_PROGRESS_H
#include "kvgen.h"

kvgen_load_progress_fn kvgen_cli_progress(void);
void kvgen_cli_progress_end(void);

#endif
