/* tu_posix.h: the few POSIX calls the C tests use, for Windows (included ahead of every test
 * source there by core/CMakeLists.txt; the tests themselves stay as on Linux). */
#ifndef KVGEN_TESTS_WIN_TU_POSIX_H
#define KVGEN_TESTS_WIN_TU_POSIX_H
#include <direct.h>
#include <io.h>
#include <stdio.h>
#include <stdlib.h>

static inline int tu_setenv(const char *name, const char *value, int overwrite) {
    if (!overwrite && getenv(name)) return 0;
    return _putenv_s(name, value);
}
static inline int tu_unsetenv(const char *name) { return _putenv_s(name, ""); }
#define setenv tu_setenv
#define unsetenv tu_unsetenv
#define popen _popen
#define pclose _pclose
#define mkdir(path, mode) _mkdir(path)
#endif
