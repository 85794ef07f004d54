/* platform.c: the parts of kvg_platform.h that are more than a rename: on POSIX the CPU count,
 * memory size, folder sync and dlopen; on Windows everything, on Win32 itself. */
#if !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE  /* madvise (glibc) */
#define _DARWIN_C_SOURCE /* madvise (macOS) */
#endif
#include "kvg_platform.h"
#include <string.h>

#if !defined(_WIN32)
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/resource.h>

void kvg_map_drop(const void *addr, size_t size) {
#ifdef MADV_DONTNEED
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || !addr) return;
    uintptr_t a = ((uintptr_t)addr + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page;
    uintptr_t e = ((uintptr_t)addr + size) / (uintptr_t)page * (uintptr_t)page;
    if (e > a) (void)madvise((void *)a, e - a, MADV_DONTNEED);
#else
    (void)addr;
    (void)size;
#endif
}

void kvg_advise_huge(void *addr, size_t size) {
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t a = ((uintptr_t)addr + huge - 1) & ~(huge - 1), e = ((uintptr_t)addr + size) & ~(huge - 1);
    if (addr && e > a) (void)madvise((void *)a, e - a, MADV_HUGEPAGE);
#else
    (void)addr;
    (void)size;
#endif
}

void kvg_sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

uint64_t kvg_time_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t kvg_wall_time_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void kvg_thread_nice(int increment) {
#if defined(__linux__)
    /* Linux keeps a nice value per thread: only the calling thread yields */
    setpriority(PRIO_PROCESS, 0, getpriority(PRIO_PROCESS, 0) + increment);
#else
    (void)increment; /* elsewhere the nice value is the whole process' */
#endif
}

int kvg_open(const char *path, int flags, int mode) { return open(path, flags | O_CLOEXEC, (mode_t)mode); }

int kvg_fsync(int fd) { return fsync(fd); }

long long kvg_pread(int fd, void *buf, size_t n, uint64_t offset) { return pread(fd, buf, n, (off_t)offset); }

int kvg_mkstemp(char *template_) { return mkstemp(template_); }

void kvg_keep_mode(int fd, const kvg_stat_t *st) {
    fchmod(fd, st->st_mode & 07777);
    if ((st->st_uid != geteuid() || st->st_gid != getegid()) && fchown(fd, st->st_uid, st->st_gid) != 0)
        fchmod(fd, st->st_mode & 0777); /* without the owner, no set-id bits */
}

int kvg_access_write(const char *path) { return faccessat(AT_FDCWD, path, W_OK, AT_EACCESS); }

const char *kvg_path_last_sep(const char *path) { return strrchr(path, '/'); }

void *kvg_map_file(int fd, size_t size) {
    void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    return m == MAP_FAILED ? NULL : m;
}

int kvg_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 1 << 20 ? 1 << 20 : (int)n;
}

uint64_t kvg_physical_memory(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

int kvg_sync_folder(const char *dir) {
#ifdef O_DIRECTORY
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
#else
    int fd = open(dir, O_RDONLY | O_CLOEXEC);
#endif
    if (fd < 0) return errno;
    /* file systems that cannot sync a folder say EINVAL: nothing to do there */
    int e = fsync(fd) == 0 || errno == EINVAL ? 0 : errno;
    close(fd);
    return e;
}

void *kvg_dl_open(const char *name, char *why, size_t why_size) {
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h && why_size) {
        const char *e = dlerror();
        snprintf(why, why_size, "%s", e ? e : "dlopen failed");
    }
    return h;
}

kvg_dl_fn kvg_dl_sym(void *lib, const char *name) {
    void *sym = dlsym(lib, name);
    kvg_dl_fn fn; /* POSIX: a data pointer from dlsym converts to a function pointer */
    memcpy(&fn, &sym, sizeof fn);
    return fn;
}

void kvg_dl_close(void *lib) {
    if (lib) dlclose(lib);
}

#else
#define WIN32_LEAN_AND_MEAN
#include <windows.h>
#include <process.h>
#include <stdlib.h>
#include <wchar.h>

/* platform.c sits below host.c (whose lock it provides): its few short-lived buffers (UTF-16
 * paths, a thread's start record) come from the C library, not the host's allocator. */

_Static_assert(sizeof(SRWLOCK) == sizeof(kvg_mutex), "kvg_mutex holds an SRWLOCK");
_Static_assert(sizeof(CONDITION_VARIABLE) == sizeof(kvg_cond), "kvg_cond holds a CONDITION_VARIABLE");

/* ---- threads ---- */

int kvg_mutex_init(kvg_mutex *m) {
    InitializeSRWLock((PSRWLOCK)m);
    return 0;
}
void kvg_mutex_destroy(kvg_mutex *m) { (void)m; /* an SRW lock holds no resources */ }
void kvg_mutex_lock(kvg_mutex *m) { AcquireSRWLockExclusive((PSRWLOCK)m); }
void kvg_mutex_unlock(kvg_mutex *m) { ReleaseSRWLockExclusive((PSRWLOCK)m); }

int kvg_cond_init(kvg_cond *c) {
    InitializeConditionVariable((PCONDITION_VARIABLE)c);
    return 0;
}
void kvg_cond_destroy(kvg_cond *c) { (void)c; }
void kvg_cond_wait(kvg_cond *c, kvg_mutex *m) {
    SleepConditionVariableSRW((PCONDITION_VARIABLE)c, (PSRWLOCK)m, INFINITE, 0);
}
void kvg_cond_signal(kvg_cond *c) { WakeConditionVariable((PCONDITION_VARIABLE)c); }
void kvg_cond_broadcast(kvg_cond *c) { WakeAllConditionVariable((PCONDITION_VARIABLE)c); }

typedef struct {
    void *(*fn)(void *);
    void *arg;
} thread_start;

static unsigned __stdcall thread_main(void *p) {
    thread_start s = *(thread_start *)p;
    free(p);
    (void)s.fn(s.arg);
    return 0;
}

int kvg_thread_create(kvg_thread *t, void *(*fn)(void *), void *arg) {
    thread_start *s = malloc(sizeof *s);
    if (!s) return ENOMEM;
    s->fn = fn;
    s->arg = arg;
    uintptr_t h = _beginthreadex(NULL, 0, thread_main, s, 0, NULL);
    if (!h) {
        int e = errno ? errno : EAGAIN;
        free(s);
        return e;
    }
    t->handle = (void *)h;
    return 0;
}

void kvg_thread_join(kvg_thread *t) {
    WaitForSingleObject((HANDLE)t->handle, INFINITE);
    CloseHandle((HANDLE)t->handle);
    t->handle = NULL;
}

void kvg_sleep_ns(uint64_t ns) {
    uint64_t ms = (ns + 999999u) / 1000000u;
    Sleep(ms > 0x7fffffffu ? 0x7fffffffu : (DWORD)ms);
}

void kvg_thread_yield(void) { SwitchToThread(); }

void kvg_thread_nice(int increment) {
    /* nice 1..4 is one step below normal, 5 and more two (Windows has no finer grain) */
    if (increment > 0)
        SetThreadPriority(GetCurrentThread(), increment < 5 ? THREAD_PRIORITY_BELOW_NORMAL : THREAD_PRIORITY_LOWEST);
}

/* ---- time and machine ---- */

uint64_t kvg_time_ns(void) {
    static LARGE_INTEGER freq; /* the same value for the process' lifetime: a benign race */
    if (!freq.QuadPart) QueryPerformanceFrequency(&freq);
    LARGE_INTEGER c;
    QueryPerformanceCounter(&c);
    uint64_t f = (uint64_t)freq.QuadPart, n = (uint64_t)c.QuadPart;
    return n / f * 1000000000u + n % f * 1000000000u / f;
}

uint64_t kvg_wall_time_ns(void) {
    FILETIME ft; /* 100 ns ticks since 1601 */
    GetSystemTimeAsFileTime(&ft);
    uint64_t t = ((uint64_t)ft.dwHighDateTime << 32) | ft.dwLowDateTime;
    return (t - 116444736000000000u) * 100u;
}

long kvg_process_id(void) { return (long)GetCurrentProcessId(); }

int kvg_cpu_count(void) {
    DWORD n = GetActiveProcessorCount(ALL_PROCESSOR_GROUPS);
    return n < 1 ? 1 : (int)n;
}

uint64_t kvg_physical_memory(void) {
    MEMORYSTATUSEX ms;
    ms.dwLength = sizeof ms;
    return GlobalMemoryStatusEx(&ms) ? (uint64_t)ms.ullTotalPhys : 0;
}

/* ---- files ---- */

static int errno_of(DWORD e) {
    switch (e) {
    case ERROR_FILE_NOT_FOUND:
    case ERROR_PATH_NOT_FOUND:
    case ERROR_INVALID_DRIVE:
    case ERROR_BAD_NETPATH: return ENOENT;
    case ERROR_ACCESS_DENIED:
    case ERROR_WRITE_PROTECT: return EACCES;
    case ERROR_SHARING_VIOLATION:
    case ERROR_LOCK_VIOLATION: return EBUSY;
    case ERROR_ALREADY_EXISTS:
    case ERROR_FILE_EXISTS: return EEXIST;
    case ERROR_NOT_ENOUGH_MEMORY:
    case ERROR_OUTOFMEMORY:
    case ERROR_COMMITMENT_LIMIT: return ENOMEM;
    case ERROR_DISK_FULL:
    case ERROR_HANDLE_DISK_FULL: return ENOSPC;
    case ERROR_INVALID_NAME:
    case ERROR_INVALID_PARAMETER:
    case ERROR_BAD_PATHNAME: return EINVAL;
    case ERROR_FILENAME_EXCED_RANGE: return ENAMETOOLONG;
    case ERROR_NOT_SAME_DEVICE: return EXDEV;
    case ERROR_DIR_NOT_EMPTY: return ENOTEMPTY;
    default: return EIO;
    }
}

/* UTF-8 to a malloc'd UTF-16 string, or NULL with errno set (EINVAL: not UTF-8) */
static wchar_t *wide(const char *s) {
    int n = MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, s, -1, NULL, 0);
    if (n <= 0) {
        errno = EINVAL;
        return NULL;
    }
    wchar_t *w = malloc((size_t)n * sizeof *w);
    if (!w) {
        errno = ENOMEM;
        return NULL;
    }
    MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, s, -1, w, n);
    return w;
}

FILE *kvg_fopen(const char *path, const char *mode) {
    wchar_t *wp = wide(path), *wm = wp ? wide(mode) : NULL;
    FILE *f = wm ? _wfopen(wp, wm) : NULL;
    int e = errno;
    free(wp);
    free(wm);
    errno = e;
    return f;
}

int kvg_open(const char *path, int flags, int mode) {
    wchar_t *wp = wide(path);
    if (!wp) return -1;
    int fd = _wopen(wp, flags | _O_BINARY | _O_NOINHERIT, mode);
    int e = errno;
    free(wp);
    errno = e;
    return fd;
}

int kvg_stat(const char *path, kvg_stat_t *st) {
    wchar_t *wp = wide(path);
    if (!wp) return -1;
    int rc = _wstat64(wp, st);
    int e = errno;
    free(wp);
    errno = e;
    return rc;
}

int kvg_fstat(int fd, kvg_stat_t *st) { return _fstat64(fd, st); }

int kvg_fsync(int fd) { return _commit(fd); }

long long kvg_pread(int fd, void *buf, size_t n, uint64_t offset) {
    HANDLE h = (HANDLE)_get_osfhandle(fd);
    if (h == INVALID_HANDLE_VALUE) {
        errno = EBADF;
        return -1;
    }
    OVERLAPPED at = {0};
    at.Offset = (DWORD)offset;
    at.OffsetHigh = (DWORD)(offset >> 32);
    DWORD got = 0, want = n > 0x40000000u ? 0x40000000u : (DWORD)n;
    if (!ReadFile(h, buf, want, &got, &at)) {
        DWORD e = GetLastError();
        if (e == ERROR_HANDLE_EOF) return 0;
        errno = errno_of(e);
        return -1;
    }
    return (long long)got;
}

int kvg_access_write(const char *path) {
    wchar_t *wp = wide(path);
    if (!wp) return -1;
    int rc = _waccess(wp, 2);
    int e = errno;
    free(wp);
    errno = e;
    return rc;
}

int kvg_mkstemp(char *template_) {
    static volatile LONG counter;
    size_t len = strlen(template_);
    if (len < 6 || strcmp(template_ + len - 6, "XXXXXX") != 0) {
        errno = EINVAL;
        return -1;
    }
    for (int attempt = 0; attempt < 100; attempt++) {
        uint64_t v = kvg_wall_time_ns() ^ ((uint64_t)GetCurrentProcessId() << 20) ^
                     ((uint64_t)(unsigned)InterlockedIncrement(&counter) * 0x9e3779b97f4a7c15u);
        for (int i = 0; i < 6; i++, v /= 36) template_[len - 6 + i] = "0123456789abcdefghijklmnopqrstuvwxyz"[v % 36];
        int fd = kvg_open(template_, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    errno = EEXIST;
    return -1;
}

long long kvg_readlink(const char *path, char *buf, size_t cap) {
    (void)path, (void)buf, (void)cap;
    errno = EINVAL; /* kvg_lstat never reports a link here */
    return -1;
}

const char *kvg_path_last_sep(const char *path) {
    const char *a = strrchr(path, '/'), *b = strrchr(path, '\\');
    if (!a || !b) return a ? a : b;
    return a > b ? a : b;
}

int kvg_sync_folder(const char *dir) {
    (void)dir; /* MoveFileEx with MOVEFILE_WRITE_THROUGH returns once the rename is on disk */
    return 0;
}

int kvg_rename_replace(const char *from, const char *to) {
    wchar_t *wf = wide(from), *wt = wf ? wide(to) : NULL;
    int rc = -1, e = errno;
    if (wt) {
        if (MoveFileExW(wf, wt, MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH)) rc = 0;
        else e = errno_of(GetLastError());
    }
    free(wf);
    free(wt);
    errno = e;
    return rc;
}

int kvg_remove(const char *path) {
    wchar_t *wp = wide(path);
    if (!wp) return -1;
    int rc = _wremove(wp);
    int e = errno;
    free(wp);
    errno = e;
    return rc;
}

int kvg_mkdir(const char *path, int mode) {
    (void)mode;
    wchar_t *wp = wide(path);
    if (!wp) return -1;
    int rc = _wmkdir(wp);
    int e = errno;
    free(wp);
    errno = e;
    return rc;
}

void *kvg_map_file(int fd, size_t size) {
    HANDLE file = (HANDLE)_get_osfhandle(fd);
    if (file == INVALID_HANDLE_VALUE) {
        errno = EBADF;
        return NULL;
    }
    HANDLE map = CreateFileMappingW(file, NULL, PAGE_READONLY, 0, 0, NULL);
    if (!map) {
        errno = errno_of(GetLastError());
        return NULL;
    }
    void *view = MapViewOfFile(map, FILE_MAP_READ, 0, 0, size);
    if (!view) errno = errno_of(GetLastError());
    CloseHandle(map); /* the view keeps the mapping alive */
    return view;
}

void kvg_advise_huge(void *addr, size_t size) {
    (void)addr;
    (void)size;
}

void kvg_map_drop(const void *addr, size_t size) {
    /* pages not locked leave the working set (read again from the file when touched) */
    if (addr && size) (void)VirtualUnlock((void *)addr, size);
}

void kvg_unmap_file(const void *addr, size_t size) {
    (void)size;
    if (addr) UnmapViewOfFile(addr);
}

/* ---- dynamic loading ---- */

void *kvg_dl_open(const char *name, char *why, size_t why_size) {
    wchar_t *wn = wide(name);
    HMODULE h = wn ? LoadLibraryExW(wn, NULL, 0) : NULL;
    DWORD e = wn ? GetLastError() : ERROR_INVALID_NAME;
    free(wn);
    if (!h && why_size) {
        char msg[256];
        DWORD n = FormatMessageA(FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS, NULL, e, 0, msg,
                                 sizeof msg, NULL);
        while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r' || msg[n - 1] == '.')) msg[--n] = 0;
        snprintf(why, why_size, "%s: %s (error %lu)", name, n ? msg : "LoadLibrary failed", (unsigned long)e);
    }
    return (void *)h;
}

kvg_dl_fn kvg_dl_sym(void *lib, const char *name) {
    FARPROC p = GetProcAddress((HMODULE)lib, name);
    kvg_dl_fn fn;
    memcpy(&fn, &p, sizeof fn);
    return fn;
}

void kvg_dl_close(void *lib) {
    if (lib) FreeLibrary((HMODULE)lib);
}
#endif
