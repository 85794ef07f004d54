/* kvg_platform.h: the operating system behind one set of names (private). Threads, mutexes and
 * condition variables, sleeping, monotonic time, the CPU count and memory size, file mapping,
 * dynamic loading, atomic file replacement and files opened by UTF-8 name.
 *
 * POSIX (Linux, the BSDs, macOS): thin inline wrappers over pthreads, clock_gettime, mmap, open
 * and rename, so that the code using them behaves exactly as the calls they stand for; the CPU
 * count, memory size, folder sync and dlopen are in platform.c.
 * Windows (mingw-w64): platform.c, on Win32 itself (SRW locks, condition variables,
 * _beginthreadex, QueryPerformanceCounter, CreateFileMapping, LoadLibrary, MoveFileEx, _wfopen),
 * with no winpthreads dependency. Paths are UTF-8 everywhere; Windows converts them to UTF-16.
 * <windows.h> never leaks out of platform.c.
 *
 *   threads   kvg_mutex (KVG_MUTEX_INIT for a static one, else kvg_mutex_init: 0 or an errno
 *             value; _destroy, _lock, _unlock), kvg_cond (_init, _destroy, _wait, _signal,
 *             _broadcast), kvg_thread_create(&t, fn, arg) (0 or an errno value; fn's result is
 *             dropped), kvg_thread_join(&t), kvg_sleep_ns(ns), kvg_thread_yield()
 *   time      kvg_time_ns() monotonic nanoseconds (arbitrary origin); kvg_wall_time_ns() since
 *             1970 (for unique names, never for intervals); kvg_process_id()
 *             kvg_thread_nice(inc) lowers the calling thread's priority (Linux: its nice value)
 *   machine   kvg_cpu_count() online logical CPUs (at least 1); kvg_physical_memory() bytes
 *             (0 when unknown)
 *   files     kvg_fopen, kvg_open (adds close-on-exec; binary mode on Windows), kvg_stat,
 *             kvg_fstat (into a kvg_stat_t) take UTF-8 paths, results and errno as the C calls';
 *             kvg_fsync(fd) 0 or -1/errno; kvg_sync_folder(dir) makes a rename into dir durable:
 *             0 or an errno value (Windows: MoveFileEx writes through, nothing to do);
 *             kvg_rename_replace(from, to) renames over `to` atomically, kvg_remove(path),
 *             kvg_mkdir(path, mode) (mode ignored on Windows): 0 or -1/errno; kvg_pread as
 *             pread(2); kvg_access_write(path) 0 when the caller may write path, else -1/errno;
 *             kvg_mkstemp as mkstemp(3); kvg_keep_mode(fd, &st) gives open file fd the
 *             permissions of the file st describes, and its owner where allowed (Windows: nothing
 *             to copy; a read-only file was refused before);
 *             kvg_lstat, kvg_readlink as POSIX's (Windows: no links: lstat is stat, readlink
 *             fails with EINVAL); kvg_path_last_sep(path) its last '/' (or '\\' on Windows), or
 *             NULL
 *   mapping   kvg_map_file(fd, size): `size` bytes of open file fd read-only, or NULL with errno
 *             set; the mapping outlives the descriptor; kvg_unmap_file(addr, size);
 *             kvg_map_drop(addr, size): the whole pages of that range of a mapping leave the
 *             process's resident memory (read from the file again if touched; a backend that
 *             keeps its own copy of some bytes calls it)
 *   loading   kvg_dl_open(name, why, why_size): a shared library's handle, or NULL with a reason
 *             in why; kvg_dl_sym(lib, name) a function (NULL if absent; cast to its real type);
 *             kvg_dl_close(lib)
 */
#ifndef KVG_PLATFORM_H
#define KVG_PLATFORM_H
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

typedef void (*kvg_dl_fn)(void);

/* on every system, in platform.c */
void kvg_sleep_ns(uint64_t ns);
uint64_t kvg_time_ns(void);
uint64_t kvg_wall_time_ns(void);
int kvg_open(const char *path, int flags, int mode);
int kvg_fsync(int fd);
long long kvg_pread(int fd, void *buf, size_t n, uint64_t offset);
int kvg_access_write(const char *path);
int kvg_mkstemp(char *template_);
const char *kvg_path_last_sep(const char *path);
void *kvg_map_file(int fd, size_t size);
/* asks that the whole huge pages (2 MiB) inside a large, long-lived buffer be backed by huge
 * pages where the system offers them (Linux: MADV_HUGEPAGE); a hint, nothing elsewhere */
void kvg_advise_huge(void *addr, size_t size);
int kvg_cpu_count(void);
uint64_t kvg_physical_memory(void);
int kvg_sync_folder(const char *dir);
void kvg_thread_nice(int increment);
void *kvg_dl_open(const char *name, char *why, size_t why_size);
kvg_dl_fn kvg_dl_sym(void *lib, const char *name);
void kvg_dl_close(void *lib);

#if !defined(_WIN32)
/* ---- POSIX: the wrappers ------------------------------------------------------------------- */
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>

typedef pthread_mutex_t kvg_mutex;
typedef pthread_cond_t kvg_cond;
typedef pthread_t kvg_thread;
typedef struct stat kvg_stat_t;
#define KVG_MUTEX_INIT PTHREAD_MUTEX_INITIALIZER

#define kvg_mutex_init(m) pthread_mutex_init((m), NULL)
#define kvg_mutex_destroy(m) ((void)pthread_mutex_destroy(m))
#define kvg_mutex_lock(m) ((void)pthread_mutex_lock(m))
#define kvg_mutex_unlock(m) ((void)pthread_mutex_unlock(m))
#define kvg_cond_init(c) pthread_cond_init((c), NULL)
#define kvg_cond_destroy(c) ((void)pthread_cond_destroy(c))
#define kvg_cond_wait(c, m) ((void)pthread_cond_wait((c), (m)))
#define kvg_cond_signal(c) ((void)pthread_cond_signal(c))
#define kvg_cond_broadcast(c) ((void)pthread_cond_broadcast(c))
#define kvg_thread_create(t, fn, arg) pthread_create((t), NULL, (fn), (arg))
#define kvg_thread_join(t) ((void)pthread_join(*(t), NULL))
#define kvg_thread_yield() ((void)sched_yield())

#define kvg_process_id() ((long)getpid())

#define kvg_fopen(path, mode) fopen((path), (mode))
#define kvg_stat(path, st) stat((path), (st))
#define kvg_lstat(path, st) lstat((path), (st))
#define kvg_readlink(path, buf, cap) readlink((path), (buf), (cap))
#define kvg_fstat(fd, st) fstat((fd), (st))
#define kvg_rename_replace(from, to) rename((from), (to))
#define kvg_remove(path) remove(path)
#define kvg_mkdir(path, mode) mkdir((path), (mode_t)(mode))
void kvg_keep_mode(int fd, const kvg_stat_t *st);
void kvg_map_drop(const void *addr, size_t size);

#define kvg_unmap_file(addr, size) ((void)munmap((void *)(addr), (size)))

#else
/* ---- Windows: platform.c ------------------------------------------------------------------- */
#include <io.h>

/* an SRW lock and a condition variable are each one pointer, zero when fresh */
typedef struct { void *p; } kvg_mutex;
typedef struct { void *p; } kvg_cond;
typedef struct { void *handle; } kvg_thread;
typedef struct _stat64 kvg_stat_t;
#define KVG_MUTEX_INIT {0}

/* flags that POSIX code passes and Windows has no use for */
#ifndef O_CLOEXEC
#define O_CLOEXEC 0
#endif
#ifndef O_NONBLOCK
#define O_NONBLOCK 0
#endif
#ifndef O_NOCTTY
#define O_NOCTTY 0
#endif
#ifndef S_ISFIFO
#define S_ISFIFO(m) (((m) & _S_IFMT) == _S_IFIFO)
#endif
#ifndef S_ISBLK
#define S_ISBLK(m) 0
#endif
#ifndef S_ISLNK
#define S_ISLNK(m) 0
#endif
#ifndef S_ISSOCK
#define S_ISSOCK(m) 0
#endif

int kvg_mutex_init(kvg_mutex *m);
void kvg_mutex_destroy(kvg_mutex *m);
void kvg_mutex_lock(kvg_mutex *m);
void kvg_mutex_unlock(kvg_mutex *m);
int kvg_cond_init(kvg_cond *c);
void kvg_cond_destroy(kvg_cond *c);
void kvg_cond_wait(kvg_cond *c, kvg_mutex *m);
void kvg_cond_signal(kvg_cond *c);
void kvg_cond_broadcast(kvg_cond *c);
int kvg_thread_create(kvg_thread *t, void *(*fn)(void *), void *arg);
void kvg_thread_join(kvg_thread *t);
void kvg_thread_yield(void);
long kvg_process_id(void);

FILE *kvg_fopen(const char *path, const char *mode);
int kvg_stat(const char *path, kvg_stat_t *st);
#define kvg_lstat(path, st) kvg_stat((path), (st))
long long kvg_readlink(const char *path, char *buf, size_t cap);
int kvg_fstat(int fd, kvg_stat_t *st);
int kvg_rename_replace(const char *from, const char *to);
int kvg_remove(const char *path);
int kvg_mkdir(const char *path, int mode);
#define kvg_keep_mode(fd, st) ((void)(fd), (void)(st))

void kvg_unmap_file(const void *addr, size_t size);
void kvg_map_drop(const void *addr, size_t size);
#endif

#endif
