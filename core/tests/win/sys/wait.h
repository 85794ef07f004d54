/* sys/wait.h for the C tests on Windows: _pclose and system return the exit code itself. */
#ifndef KVGEN_TESTS_WIN_SYS_WAIT_H
#define KVGEN_TESTS_WIN_SYS_WAIT_H
#define WIFEXITED(status) ((status) != -1)
#define WEXITSTATUS(status) (status)
#define WIFSIGNALED(status) 0
#define WTERMSIG(status) 0
#endif
