/* Faults: out of memory (RLIMIT_AS), fork in awkward places, exit in the
 * middle of allocations, thread churn and a long producer/consumer run.
 * Linked like every tests/test_*.c (malloc is hakmem's).
 *
 * Sizes and times can be raised for the soak:
 *   HAK_FAULTS_CHURN_THREADS   threads in the churn test (default 100000)
 *   HAK_FAULTS_PC_SECONDS      producer/consumer duration (default 10)
 * Bounds (documented in docs/RELIABILITY.md):
 *   churn: peak RSS (VmHWM) below CHURN_HWM_MB
 *   producer/consumer: RSS below PC_RSS_MB at every 50 ms sample */
#define _GNU_SOURCE
#include "blocks.h"
#include "harness.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <malloc.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/time.h>

#define MiB ((size_t)1 << 20)
#define CHURN_HWM_MB 256
#define PC_RSS_MB 384

static size_t env_size(const char *name, size_t def) {
  const char *v = getenv(name);
  return v && *v ? strtoul(v, NULL, 0) : def;
}

/* /proc/self/status field in bytes (VmSize, VmRSS, VmHWM), 0 if absent. */
static size_t proc_status(const char *field) {
  long kib = th_proc_status(field);
  return kib > 0 ? (size_t)kib * 1024 : 0;
}

static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return (*s * 0x2545F4914F6CDD1Dull) >> 16;
}

/* Waits up to `secs` for pid; on timeout kills it and returns -1. */
static int wait_timeout(pid_t pid, double secs) {
  double end = th_now() + secs;
  int status;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return -2;
    if (th_now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    usleep(1000);
  }
}

/* ------------------------------------------------------------------ */
/* Out of memory                                                       */
/* ------------------------------------------------------------------ */

static void limit_address_space(size_t extra) {
  struct rlimit rl;
  size_t cur = proc_status("VmSize");
  REQUIRE(cur > 0);
  rl.rlim_cur = rl.rlim_max = cur + extra;
  REQUIRE(setrlimit(RLIMIT_AS, &rl) == 0);
}

/* Blocks are chained through their first word; the second word (if it
 * fits) is a check value. */
typedef struct chain_s {
  struct chain_s *next;
  uintptr_t check;
} chain_t;

static void chain_push(chain_t **head, void *p, size_t size) {
  chain_t *c = p;
  c->next = *head;
  if (size >= sizeof(chain_t)) c->check = (uintptr_t)p ^ 0xC0FFEE;
  ((volatile char *)p)[size - 1] = 7; /* the last byte is writable too */
  *head = c;
}

static size_t chain_free(chain_t **head, size_t size) {
  size_t n = 0, bad = 0;
  for (chain_t *c = *head, *next; c; c = next) {
    next = c->next;
    if (size >= sizeof(chain_t) && c->check != ((uintptr_t)c ^ 0xC0FFEE)) bad++;
    free(c);
    n++;
  }
  *head = NULL;
  CHECK_MSG(bad == 0, "%zu blocks were overwritten while the process was out of memory", bad);
  return n;
}

static const size_t BIG_FAIL = (size_t)512 << 20; /* more than the limit leaves */

static void oom_tier(size_t bs) {
  limit_address_space(256 * MiB);
  chain_t *head = NULL;
  size_t n = 0;
  double t0 = th_now();
  for (;;) {
    errno = 0;
    void *p = malloc(bs);
    if (!p) {
      CHECK_MSG(errno == ENOMEM, "malloc(%zu) failed with errno %d, not ENOMEM", bs, errno);
      break;
    }
    chain_push(&head, p, bs);
    n++;
    REQUIRE(th_now() - t0 < 30); /* no limit reached: RLIMIT_AS not honoured? */
  }
  printf("    %zu B blocks: %zu allocated (%.0f MiB) before ENOMEM\n", bs, n, n * (double)bs / MiB);
  CHECK_MSG(n * bs >= 64 * MiB, "only %zu bytes before ENOMEM under a 256 MiB headroom", n * bs);

  /* At the limit: the other entry points fail cleanly too. */
  errno = 0;
  void *q = calloc(1, bs);
  if (q) chain_push(&head, q, bs);
  else CHECK_MSG(errno == ENOMEM, "calloc(1, %zu) at the limit: errno %d", bs, errno);
  errno = 0;
  q = calloc(BIG_FAIL / 64, 64);
  CHECK(q == NULL && errno == ENOMEM);
  errno = 0;
  q = malloc(BIG_FAIL);
  CHECK(q == NULL && errno == ENOMEM);
  /* realloc: a failed realloc keeps the block and its contents */
  chain_t *first = head;
  const uintptr_t want = (uintptr_t)first ^ 0xC0FFEE;
  errno = 0;
  q = realloc(first, BIG_FAIL);
  CHECK(q == NULL && errno == ENOMEM);
  if (bs >= sizeof(chain_t)) CHECK_MSG(first->check == want, "a failed realloc damaged the block");
  errno = 0;
  q = realloc(first, bs * 4 + 4096);
  if (q == NULL) {
    CHECK_MSG(errno == ENOMEM, "realloc(%zu) at the limit: errno %d", bs * 4 + 4096, errno);
    if (bs >= sizeof(chain_t)) CHECK_MSG(first->check == want, "a failed realloc damaged the block");
  } else {
    chain_t *c = q;
    if (bs >= sizeof(chain_t)) CHECK_MSG(c->check == want, "realloc at the limit lost the contents");
    c->check = (uintptr_t)c ^ 0xC0FFEE;
    head = c; /* next pointer was copied */
  }
  void *pm = (void *)1;
  int rc = posix_memalign(&pm, 64, bs);
  if (rc == 0) chain_push(&head, pm, bs);
  else CHECK_MSG(rc == ENOMEM && pm == (void *)1, "posix_memalign at the limit returned %d", rc);
  pm = (void *)1;
  rc = posix_memalign(&pm, 4096, BIG_FAIL);
  CHECK_MSG(rc == ENOMEM && pm == (void *)1, "posix_memalign(4096, 512 MiB) returned %d", rc);
  errno = 0;
  q = aligned_alloc(1 << 16, BIG_FAIL);
  CHECK(q == NULL && errno == ENOMEM);

  /* Free everything: the memory is usable again, for this tier and others. */
  size_t freed = chain_free(&head, bs);
  CHECK(freed >= n);
  size_t again = 0;
  for (; again < n / 2; again++) {
    void *p = malloc(bs);
    if (!p) break;
    chain_push(&head, p, bs);
  }
  CHECK_MSG(again == n / 2, "after freeing everything only %zu of %zu blocks could be allocated again",
            again, n / 2);
  chain_free(&head, bs);
  size_t other[] = {64, 16384, 200000, 4 * MiB};
  for (size_t i = 0; i < 4; i++) {
    void *p = malloc(other[i]);
    CHECK_MSG(p != NULL, "malloc(%zu) fails after recovering from ENOMEM", other[i]);
    if (p) memset(p, 1, other[i]);
    free(p);
  }
}

TEST_T(oom_64B_blocks_enomem_then_recovers, 60) { oom_tier(64); }
TEST_T(oom_16KiB_blocks_enomem_then_recovers, 60) { oom_tier(16384); }
TEST_T(oom_200KiB_blocks_enomem_then_recovers, 60) { oom_tier(200000); }
TEST_T(oom_4MiB_blocks_enomem_then_recovers, 60) { oom_tier(4 * MiB); }

/* Root, without CAP_IPC_LOCK in effect, is held to RLIMIT_MEMLOCK as any
 * user is. */
static void drop_ipc_lock(void) {
  struct __user_cap_header_struct head = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  REQUIRE(syscall(SYS_capget, &head, data) == 0);
  data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
  REQUIRE(syscall(SYS_capset, &head, data) == 0);
}

/* The areas mapped before mlockall(MCL_FUTURE), which it does not lock:
 * /proc/self/maps read by areas_before_lock. */
static struct {
  unsigned long lo, hi;
} before_lock[1024];
static int areas_before;

static void areas_before_lock(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  REQUIRE(f != NULL);
  char line[512];
  while (areas_before < 1024 && fgets(line, sizeof line, f))
    if (sscanf(line, "%lx-%lx ", &before_lock[areas_before].lo, &before_lock[areas_before].hi) == 2)
      areas_before++;
  fclose(f);
}

/* Whether the kernel keeps p's page locked (VmFlags "lo" of its area in
 * /proc/self/smaps), or p is in an area mapped before the lock. */
static bool page_locked(const void *p) {
  for (int i = 0; i < areas_before; i++)
    if ((uintptr_t)p >= before_lock[i].lo && (uintptr_t)p < before_lock[i].hi) return true;
  FILE *f = fopen("/proc/self/smaps", "r");
  if (f == NULL) return false;
  char line[512];
  bool in = false, locked = false;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
      in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
    } else if (in && strncmp(line, "VmFlags:", 8) == 0) {
      locked = strstr(line, " lo") != NULL;
      break;
    }
  }
  fclose(f);
  return locked;
}

/* Blocks of each tier, from calloc and read zero, or from malloc, written
 * and checked; then freed. False if one was refused or wrong. */
static bool tier_blocks(bool from_calloc) {
  static const size_t size[] = {48, 1000, 20000, 300 << 10};
  static const int count[] = {2000, 500, 60, 3};
  bool ok = true;
  for (int k = 0; k < 4 && ok; k++) {
    unsigned char *p[2000];
    for (int i = 0; i < count[k]; i++) {
      ok &= (p[i] = from_calloc ? calloc(1, size[k]) : malloc(size[k])) != NULL;
      if (p[i] == NULL) continue;
      if (from_calloc)
        ok &= first_nonzero(p[i], size[k]) == size[k];
      else
        memset(p[i], i & 0xFF, size[k]);
    }
    for (int i = 0; i < count[k]; i++) {
      if (p[i] && !from_calloc) ok &= p[i][0] == (i & 0xFF) && p[i][size[k] - 1] == (i & 0xFF);
      free(p[i]);
    }
  }
  return ok;
}

/* Blocks of each tier, written, then checked and freed: false if one was
 * refused or lost its bytes. */
static bool blocks_of_each_tier(void) { return tier_blocks(false); }

static void *blocks_of_each_tier_thread(void *ok) {
  *(bool *)ok = blocks_of_each_tier();
  return NULL;
}

/* calloc's blocks of three sizes, zero and on locked pages (or on pages
 * mapped before the lock, which it does not lock), twice: freed between,
 * and purged after the delay (100 ms). No thread can be made for the
 * purges under the limit: the program's calls make them, and a large
 * block's does. */
static void *zero_and_locked_blocks(void *arg) {
  enum { N = 100 };
  static const size_t size[] = {48, 1000, 20000};
  static unsigned char *z[3][N];
  for (int round = 0; round < 2; round++) {
    int dirty = 0, unlocked = 0;
    for (int k = 0; k < 3; k++)
      for (int i = 0; i < N; i++) {
        REQUIRE((z[k][i] = calloc(1, size[k])) != NULL);
        for (size_t j = 0; j < size[k]; j++) dirty += z[k][i][j] != 0;
        unlocked += !page_locked(z[k][i]) + !page_locked(z[k][i] + size[k] - 1);
        memset(z[k][i], 0xAB, size[k]);
      }
    for (int k = 0; k < 3; k++)
      for (int i = 0; i < N; i++) free(z[k][i]);
    CHECK_MSG(dirty == 0, "round %d: %d bytes of calloc's blocks not zero", round, dirty);
    CHECK_MSG(unlocked == 0, "round %d: %d pages of calloc's blocks not locked", round, unlocked);
    usleep(300 * 1000);
    free(malloc(300 << 10));
  }
  return arg;
}

/* A user other than root may lock 8 MiB (RLIMIT_MEMLOCK's default), and
 * after mlockall(MCL_FUTURE) the kernel counts every new mapping against
 * that, inaccessible or not: hakmem's first segment (8 MiB mapped to align
 * 4 MiB) was refused, and every malloc failed. The limit counts the pages
 * in use now, in threads started after the lock too, and memory purged
 * reads zero and stays locked for its next use. */
TEST_T(a_program_that_locks_its_future_memory_within_a_users_limit_allocates, 30) {
  enum { LIMIT = 8 << 20 };
  drop_ipc_lock();
  REQUIRE(setrlimit(RLIMIT_MEMLOCK, &(struct rlimit){LIMIT, LIMIT}) == 0);
  areas_before_lock();
  REQUIRE(mlockall(MCL_FUTURE) == 0);
  CHECK(blocks_of_each_tier());
  bool ok = false;
  th_run_on_small_stack(blocks_of_each_tier_thread, &ok);
  CHECK(ok);
  th_run_on_small_stack(zero_and_locked_blocks, NULL);
  long locked = th_proc_status("VmLck");
  printf("    %ld KiB locked\n", locked);
  CHECK_MSG(locked <= LIMIT >> 10, "%ld KiB locked", locked);
}

/* After munlockall the limit holds no more: memory is not locked for
 * the program any longer, and it may use more than 8 MiB. */
TEST_T(a_program_that_unlocks_its_memory_may_use_more_than_its_lock_limit, 30) {
  enum { LIMIT = 8 << 20, N = 64, SIZE = 400 << 10 };
  drop_ipc_lock();
  REQUIRE(setrlimit(RLIMIT_MEMLOCK, &(struct rlimit){LIMIT, LIMIT}) == 0);
  REQUIRE(mlockall(MCL_FUTURE) == 0);
  CHECK(blocks_of_each_tier());
  REQUIRE(munlockall() == 0);
  static unsigned char *p[N];
  int refused = 0;
  for (int i = 0; i < N; i++) {
    refused += (p[i] = malloc(i % 2 ? SIZE : SIZE / 40)) == NULL;
    if (p[i]) memset(p[i], 1, i % 2 ? SIZE : SIZE / 40);
  }
  long locked = th_proc_status("VmLck");
  for (int i = 0; i < N; i++) free(p[i]);
  CHECK_MSG(refused == 0, "%d of %d blocks refused", refused, N);
  CHECK_MSG(locked == 0, "%ld KiB locked", locked);
}

#if defined(__x86_64__)
/* The system calls systemd 252 (Debian 12) allows a service whose unit
 * says SystemCallFilter=@system-service and SystemCallFilter=~@privileged
 * @resources, as Debian's redis-server.service does: the kernel kills it
 * at any other. The names of `systemd-analyze syscall-filter` that
 * x86_64's <sys/syscall.h> defines. */
static const int service_calls[] = {
  SYS_accept, SYS_accept4, SYS_access, SYS_add_key, SYS_alarm, SYS_arch_prctl, SYS_bind, SYS_brk,
  SYS_capget, SYS_chdir, SYS_chmod, SYS_clock_getres, SYS_clock_gettime, SYS_clock_nanosleep,
  SYS_clone, SYS_clone3, SYS_close, SYS_close_range, SYS_connect, SYS_copy_file_range, SYS_creat,
  SYS_dup, SYS_dup2, SYS_dup3, SYS_epoll_create, SYS_epoll_create1, SYS_epoll_ctl,
  SYS_epoll_ctl_old, SYS_epoll_pwait, SYS_epoll_pwait2, SYS_epoll_wait, SYS_epoll_wait_old,
  SYS_eventfd, SYS_eventfd2, SYS_execve, SYS_execveat, SYS_exit, SYS_exit_group, SYS_faccessat,
  SYS_faccessat2, SYS_fadvise64, SYS_fallocate, SYS_fchdir, SYS_fchmod, SYS_fchmodat, SYS_fcntl,
  SYS_fdatasync, SYS_fgetxattr, SYS_flistxattr, SYS_flock, SYS_fork, SYS_fremovexattr,
  SYS_fsetxattr, SYS_fstat, SYS_fstatfs, SYS_fsync, SYS_ftruncate, SYS_futex, SYS_futex_waitv,
  SYS_futimesat, SYS_get_mempolicy, SYS_get_robust_list, SYS_get_thread_area, SYS_getcpu,
  SYS_getcwd, SYS_getdents, SYS_getdents64, SYS_getegid, SYS_geteuid, SYS_getgid, SYS_getgroups,
  SYS_getitimer, SYS_getpeername, SYS_getpgid, SYS_getpgrp, SYS_getpid, SYS_getppid,
  SYS_getpriority, SYS_getrandom, SYS_getresgid, SYS_getresuid, SYS_getrlimit, SYS_getrusage,
  SYS_getsid, SYS_getsockname, SYS_getsockopt, SYS_gettid, SYS_gettimeofday, SYS_getuid,
  SYS_getxattr, SYS_inotify_add_watch, SYS_inotify_init, SYS_inotify_init1, SYS_inotify_rm_watch,
  SYS_io_cancel, SYS_io_destroy, SYS_io_getevents, SYS_io_pgetevents, SYS_io_setup, SYS_io_submit,
  SYS_io_uring_enter, SYS_io_uring_register, SYS_io_uring_setup, SYS_ioctl, SYS_ioprio_get,
  SYS_kcmp, SYS_keyctl, SYS_kill, SYS_lgetxattr, SYS_link, SYS_linkat, SYS_listen, SYS_listxattr,
  SYS_llistxattr, SYS_lremovexattr, SYS_lseek, SYS_lsetxattr, SYS_lstat, SYS_madvise,
  SYS_membarrier, SYS_memfd_create, SYS_mkdir, SYS_mkdirat, SYS_mknod, SYS_mknodat, SYS_mlock,
  SYS_mlock2, SYS_mlockall, SYS_mmap, SYS_mprotect, SYS_mq_getsetattr, SYS_mq_notify, SYS_mq_open,
  SYS_mq_timedreceive, SYS_mq_timedsend, SYS_mq_unlink, SYS_mremap, SYS_msgctl, SYS_msgget,
  SYS_msgrcv, SYS_msgsnd, SYS_msync, SYS_munlock, SYS_munlockall, SYS_munmap,
  SYS_name_to_handle_at, SYS_nanosleep, SYS_newfstatat, SYS_open, SYS_openat, SYS_openat2,
  SYS_pause, SYS_personality, SYS_pidfd_open, SYS_pidfd_send_signal, SYS_pipe, SYS_pipe2, SYS_poll,
  SYS_ppoll, SYS_prctl, SYS_pread64, SYS_preadv, SYS_preadv2, SYS_prlimit64, SYS_process_madvise,
  SYS_process_vm_readv, SYS_process_vm_writev, SYS_pselect6, SYS_pwrite64, SYS_pwritev,
  SYS_pwritev2, SYS_read, SYS_readahead, SYS_readlink, SYS_readlinkat, SYS_readv, SYS_recvfrom,
  SYS_recvmmsg, SYS_recvmsg, SYS_remap_file_pages, SYS_removexattr, SYS_rename, SYS_renameat,
  SYS_renameat2, SYS_request_key, SYS_restart_syscall, SYS_rmdir, SYS_rseq, SYS_rt_sigaction,
  SYS_rt_sigpending, SYS_rt_sigprocmask, SYS_rt_sigqueueinfo, SYS_rt_sigreturn, SYS_rt_sigsuspend,
  SYS_rt_sigtimedwait, SYS_rt_tgsigqueueinfo, SYS_sched_get_priority_max,
  SYS_sched_get_priority_min, SYS_sched_getaffinity, SYS_sched_getattr, SYS_sched_getparam,
  SYS_sched_getscheduler, SYS_sched_rr_get_interval, SYS_sched_yield, SYS_select, SYS_semctl,
  SYS_semget, SYS_semop, SYS_semtimedop, SYS_sendfile, SYS_sendmmsg, SYS_sendmsg, SYS_sendto,
  SYS_set_robust_list, SYS_set_thread_area, SYS_set_tid_address, SYS_setfsgid, SYS_setgid,
  SYS_setitimer, SYS_setns, SYS_setpgid, SYS_setregid, SYS_setresgid, SYS_setsid, SYS_setsockopt,
  SYS_setxattr, SYS_shmat, SYS_shmctl, SYS_shmdt, SYS_shmget, SYS_shutdown, SYS_sigaltstack,
  SYS_signalfd, SYS_signalfd4, SYS_socket, SYS_socketpair, SYS_splice, SYS_stat, SYS_statfs,
  SYS_statx, SYS_symlink, SYS_symlinkat, SYS_sync, SYS_sync_file_range, SYS_syncfs, SYS_sysinfo,
  SYS_tee, SYS_tgkill, SYS_time, SYS_timer_create, SYS_timer_delete, SYS_timer_getoverrun,
  SYS_timer_gettime, SYS_timer_settime, SYS_timerfd_create, SYS_timerfd_gettime,
  SYS_timerfd_settime, SYS_times, SYS_tkill, SYS_truncate, SYS_umask, SYS_uname, SYS_unlink,
  SYS_unlinkat, SYS_unshare, SYS_userfaultfd, SYS_utime, SYS_utimensat, SYS_utimes, SYS_vfork,
  SYS_vmsplice, SYS_wait4, SYS_waitid, SYS_write, SYS_writev,
};

/* From here on the process, and what it runs, may make only the calls of
 * service_calls (as systemd sets it up before it runs the service), and
 * those of `refused` fail with EPERM (as SystemCallFilter=~ and
 * SystemCallErrorNumber=EPERM make them). */
static void allow_only_service_calls(const int *refused, size_t n_refused) {
  enum { N = sizeof service_calls / sizeof service_calls[0], MOST_REFUSED = 4 };
  static struct sock_filter f[2 * (N + MOST_REFUSED) + 5];
  size_t k = 0;
  REQUIRE(n_refused <= MOST_REFUSED);
  f[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
  f[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0);
  f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
  f[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
  for (size_t i = 0; i < n_refused; i++) {
    f[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)refused[i], 0, 1);
    f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
  }
  for (size_t i = 0; i < N; i++) {
    f[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)service_calls[i], 0, 1);
    f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
  }
  f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
  struct sock_fprog prog = {(unsigned short)k, f};
  REQUIRE(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0);
  REQUIRE(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0);
}

static void *blocks_of_each_tier_freeing(void *block) {
  free(block);
  return blocks_of_each_tier() ? block : NULL;
}

/* calloc's blocks of each tier, where blocks were written and purged:
 * false if one was refused or is not zero. */
static bool calloc_reads_zero(void) { return tier_blocks(true); }

/* What a service does with its memory, run by exec under the list: every
 * tier, large blocks freed (the arena looks at how much of them was
 * written), a thread freeing the main thread's block, locked memory, a
 * fork, and purges. */
static int service_child(void) {
  bool ok = blocks_of_each_tier();
  for (size_t i = 0; i < 40 && ok; i++) {
    unsigned char *p = malloc((1 + i % 8) << 20);
    ok = p != NULL;
    if (ok) memset(p, (int)i, 64 << 10);
    free(p);
  }
  pthread_t t;
  void *block = malloc(100), *done = NULL;
  ok &= pthread_create(&t, NULL, blocks_of_each_tier_freeing, block) == 0 && pthread_join(t, &done) == 0 &&
        done == block;
  if (mlockall(MCL_FUTURE) == 0) {
    void *p[100];
    for (int i = 0; i < 100; i++) ok &= (p[i] = malloc(60000)) != NULL;
    for (int i = 0; i < 100; i++) free(p[i]);
    ok &= blocks_of_each_tier() && munlockall() == 0;
  }
  pid_t pid = fork();
  if (pid == 0) _exit(blocks_of_each_tier() ? 0 : 1);
  int status = -1;
  ok &= pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  usleep(400 * 1000); /* the purges, after the delay (100 ms) */
  ok &= calloc_reads_zero() && blocks_of_each_tier();
  printf("service child: %s\n", ok ? "done" : "failed");
  return ok ? 0 : 1;
}

/* service_child, run by exec under the list with `refused` failing with
 * EPERM, must exit 0. */
static void run_service_child(const int *refused, size_t n_refused) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv("HAKMEM_PURGE_DELAY_MS", "100", 1);
    allow_only_service_calls(refused, n_refused);
    execl("/proc/self/exe", "test_faults", "--service-child", (char *)NULL);
    _exit(99);
  }
  int status = wait_timeout(pid, 20);
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s %d", WIFSIGNALED(status) ? "killed by signal" : "status",
            WIFSIGNALED(status) ? WTERMSIG(status) : status);
}

/* Under systemd's list a service was killed at its first segment: hakmem
 * asked mincore whether the segment was locked. The list holds: a call
 * outside it kills the child that makes it. */
TEST_T(a_service_allowed_only_systemds_system_service_calls_runs, 30) {
  pid_t pid = fork();
  if (pid == 0) {
    allow_only_service_calls(NULL, 0);
    unsigned char in;
    syscall(SYS_mincore, &in, (size_t)1, &in);
    _exit(0);
  }
  int status = wait_timeout(pid, 10);
  CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGSYS, "mincore outside the list: status %d", status);
  run_service_child(NULL, 0);
}

/* A list may refuse what the allocator would rather use: blocks are
 * purged by mapping their pages again, and calloc still reads zero. */
TEST_T(a_service_refused_madvise_and_mremap_runs_and_calloc_reads_zero, 30) {
  static const int refused[] = {SYS_madvise, SYS_mremap};
  pid_t pid = fork();
  if (pid == 0) {
    allow_only_service_calls(refused, 2);
    _exit(madvise(&pid, 1, MADV_NORMAL) == -1 && errno == EPERM ? 0 : 1);
  }
  int status = wait_timeout(pid, 10);
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "madvise not refused: status %d", status);
  run_service_child(refused, 2);
}
#endif

/* A large block the arena cannot hold lives in a mapping of its own (under
 * this limit the arena is a quarter of the address space left at most, 128
 * MiB); when mremap cannot grow it in place, the block and its header move.
 * Frees and reallocs must then find the header where it went. */
TEST_T(large_block_moved_by_mremap_is_freed_at_its_new_place, 30) {
  limit_address_space(512 * MiB);
  size_t size = 130 * MiB;
  unsigned char *p = malloc(size);
  REQUIRE(p != NULL);
  memset(p, 0x5A, size);
  /* a page right past the mapping: growing in place is impossible */
  uintptr_t end = ((uintptr_t)p + size + 4095) & ~(uintptr_t)4095;
  void *wall = mmap((void *)end, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                    -1, 0);
  REQUIRE(wall == (void *)end);
  size_t grown = size + size / 4; /* the old and the new mapping within the limit */
  unsigned char *q = realloc(p, grown);
  REQUIRE(q != NULL);
  CHECK(q != p);
  CHECK(q[0] == 0x5A && q[size - 1] == 0x5A);
  CHECK(malloc_usable_size(q) >= grown);
  free(q);
  void *r = malloc(size); /* the allocator still works */
  CHECK(r != NULL);
  free(r);
  munmap(wall, 4096);
}

/* 100k mixed operations at the limit: some fail, nothing crashes, contents
 * survive, and freed memory is reused. */
TEST_T(oom_mixed_100k_ops_at_the_limit, 90) {
  enum { SLOTS = 4096 };
  static struct { unsigned char *p; size_t size; uint64_t tag; } s[SLOTS];
  limit_address_space(256 * MiB);
  uint64_t seed = 12345;
  size_t fails = 0, allocs = 0, frees = 0, reallocs = 0, bad = 0;
  for (int op = 0; op < 100000; op++) {
    size_t i = rnd(&seed) % SLOTS;
    unsigned k = (unsigned)(rnd(&seed) % 100);
    size_t size = k < 50   ? 2 + rnd(&seed) % 1023 /* >= 2: first and last byte differ */
                  : k < 75 ? 1025 + rnd(&seed) % 32768
                  : k < 90 ? 32769 + rnd(&seed) % 262144
                           : MiB + rnd(&seed) % (7 * MiB);
    if (s[i].p) {
      if (s[i].p[0] != (unsigned char)s[i].tag || s[i].p[s[i].size - 1] != (unsigned char)(s[i].tag >> 8))
        bad++;
      if (k % 5 == 0) { /* realloc instead of free */
        errno = 0;
        unsigned char *q = realloc(s[i].p, size);
        if (!q) {
          fails++;
          CHECK_MSG(errno == ENOMEM, "realloc failed with errno %d", errno);
          continue; /* block stays */
        }
        if (q[0] != (unsigned char)s[i].tag) bad++;
        s[i].p = q;
        s[i].size = size;
        q[0] = (unsigned char)s[i].tag;
        q[size - 1] = (unsigned char)(s[i].tag >> 8);
        reallocs++;
        continue;
      }
      free(s[i].p);
      s[i].p = NULL;
      frees++;
      continue;
    }
    errno = 0;
    unsigned char *p = (k & 1) ? malloc(size) : calloc(1, size);
    if (!p) {
      fails++;
      CHECK_MSG(errno == ENOMEM, "allocation of %zu failed with errno %d", size, errno);
      continue;
    }
    allocs++;
    s[i].p = p;
    s[i].size = size;
    s[i].tag = rnd(&seed);
    p[0] = (unsigned char)s[i].tag;
    p[size - 1] = (unsigned char)(s[i].tag >> 8);
  }
  printf("    100000 ops: %zu allocations, %zu frees, %zu reallocs, %zu failed with ENOMEM\n", allocs,
         frees, reallocs, fails);
  CHECK_MSG(bad == 0, "%zu blocks lost their contents", bad);
  CHECK_MSG(fails > 0, "the limit was never reached (test too weak)");
  CHECK_MSG(allocs > 10000, "only %zu allocations succeeded", allocs);
  for (size_t i = 0; i < SLOTS; i++) free(s[i].p), s[i].p = NULL;
  /* freed memory is reusable: 128 MiB in 1 MiB blocks, then small ones */
  void *blocks[128];
  int got = 0;
  for (; got < 128; got++)
    if (!(blocks[got] = malloc(MiB))) break;
  CHECK_MSG(got == 128, "only %d MiB could be allocated again after freeing everything", got);
  for (int i = 0; i < got; i++) free(blocks[i]);
  chain_t *head = NULL;
  for (int i = 0; i < 100000; i++) {
    void *p = malloc(100);
    if (!p) {
      CHECK_MSG(0, "small allocation %d failed after freeing everything", i);
      break;
    }
    chain_push(&head, p, 100);
  }
  chain_free(&head, 100);
}

/* ------------------------------------------------------------------ */
/* Fork                                                                */
/* ------------------------------------------------------------------ */

static _Atomic int bg_stop;
static _Atomic uint64_t bg_ops;

static void *background_allocator(void *arg) {
  uint64_t seed = 0x1234567 + (uintptr_t)arg;
  void *keep[64] = {0};
  while (!atomic_load_explicit(&bg_stop, memory_order_relaxed)) {
    size_t i = rnd(&seed) % 64;
    free(keep[i]);
    unsigned k = (unsigned)(rnd(&seed) % 100);
    size_t size = k < 70 ? rnd(&seed) % 512 : k < 95 ? rnd(&seed) % 65536 : rnd(&seed) % (2 * MiB);
    keep[i] = malloc(size);
    if (keep[i]) memset(keep[i], (int)i, size < 256 ? size : 256);
    atomic_fetch_add_explicit(&bg_ops, 1, memory_order_relaxed);
  }
  for (int i = 0; i < 64; i++) free(keep[i]);
  return NULL;
}

static void start_background(pthread_t *th, int n) {
  atomic_store(&bg_stop, 0);
  for (int i = 0; i < n; i++) REQUIRE(pthread_create(&th[i], NULL, background_allocator, (void *)(uintptr_t)i) == 0);
  while (atomic_load(&bg_ops) < 1000) usleep(100);
}
static void stop_background(pthread_t *th, int n) {
  atomic_store(&bg_stop, 1);
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

/* What a forked child does: allocate in every tier, check, free, exit 0. */
static void child_work(void) {
  static const size_t sizes[] = {1, 48, 1000, 5000, 30000, 200000, 3 * MiB};
  void *p[7];
  for (int i = 0; i < 7; i++) {
    p[i] = malloc(sizes[i]);
    if (!p[i]) _exit(3);
    memset(p[i], i + 1, sizes[i]);
  }
  for (int i = 0; i < 7; i++) {
    if (((unsigned char *)p[i])[sizes[i] - 1] != i + 1) _exit(4);
    free(p[i]);
  }
}

TEST_T(fork_200_times_while_3_threads_allocate, 120) {
  pthread_t th[3];
  start_background(th, 3);
  int ok = 0, hung = 0, bad = 0;
  double t0 = th_now();
  for (int i = 0; i < 200; i++) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      alarm(10);
      child_work();
      _exit(0);
    }
    int st = wait_timeout(pid, 10);
    if (st == -1) hung++;
    else if (WIFEXITED(st) && WEXITSTATUS(st) == 0) ok++;
    else {
      if (bad++ < 3) fprintf(stderr, "    child %d: status 0x%x\n", i, st);
    }
  }
  stop_background(th, 3);
  printf("    200 forks in %.2fs: %d ok, %d hung, %d failed\n", th_now() - t0, ok, hung, bad);
  CHECK(ok == 200);
}

/* fork() from a signal handler while other threads allocate. The handler
 * runs on the main thread, which is not itself inside malloc (forking from
 * a handler that interrupted malloc is undefined for any allocator). */
#define SIG_FORKS 50
static pid_t sig_pids[SIG_FORKS];
static volatile sig_atomic_t sig_nforks;
static void fork_handler(int sig) {
  int saved = errno;
  pid_t pid = fork();
  if (pid == 0) {
    if (sig_nforks & 1) { /* half the children allocate a little */
      void *p = malloc(100);
      if (p) memset(p, 1, 100);
      free(p);
    }
    _exit(0);
  }
  if (sig_nforks < SIG_FORKS) sig_pids[sig_nforks] = pid;
  sig_nforks++;
  errno = saved;
}

static void *signal_sender(void *arg) {
  pthread_t target = *(pthread_t *)arg;
  for (int i = 0; i < SIG_FORKS; i++) {
    int before = sig_nforks;
    pthread_kill(target, i & 1 ? SIGUSR1 : SIGUSR2);
    for (int w = 0; w < 5000 && sig_nforks == before; w++) usleep(1000);
  }
  return NULL;
}

TEST_T(fork_from_signal_handler_while_threads_allocate, 60) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = fork_handler;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, NULL);
  sigaction(SIGUSR2, &sa, NULL);
  pthread_t th[3], sender, self = pthread_self();
  start_background(th, 3);
  REQUIRE(pthread_create(&sender, NULL, signal_sender, &self) == 0);
  double t0 = th_now();
  while (sig_nforks < SIG_FORKS && th_now() - t0 < 30) usleep(2000); /* main waits, not in malloc */
  pthread_join(sender, NULL);
  stop_background(th, 3);
  int ok = 0, n = sig_nforks < SIG_FORKS ? sig_nforks : SIG_FORKS;
  for (int i = 0; i < n; i++) {
    int st = wait_timeout(sig_pids[i], 10);
    if (st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0) ok++;
    else fprintf(stderr, "    child %d: %s (0x%x)\n", i, st == -1 ? "hung" : "failed", st);
  }
  printf("    %d forks from a signal handler in %.2fs, %d children exited 0\n", n, th_now() - t0, ok);
  CHECK(n == SIG_FORKS);
  CHECK(ok == SIG_FORKS);
}

/* A child exits (with _exit, or exit which runs destructors) while several
 * of its threads are in the middle of allocating. */
static void exit_mid_allocation(int use_exit) {
  int ok = 0, rounds = 20;
  double worst = 0;
  for (int r = 0; r < rounds; r++) {
    double t0 = th_now();
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      pthread_t th[4];
      for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, background_allocator, (void *)(uintptr_t)i);
      usleep(20000 + 2000 * r);
      if (use_exit) exit(0);
      _exit(0);
    }
    int st = wait_timeout(pid, 10);
    double dt = th_now() - t0;
    if (dt > worst) worst = dt;
    if (st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0) ok++;
    else fprintf(stderr, "    round %d: %s (status 0x%x)\n", r, st == -1 ? "hung" : "failed", st);
  }
  printf("    %d/%d children exited 0, slowest %.3fs\n", ok, rounds, worst);
  CHECK(ok == rounds);
  CHECK_MSG(worst < 2.0, "a child took %.2fs to exit", worst);
}
TEST_T(child_underscore_exit_while_threads_allocate, 60) { exit_mid_allocation(0); }
TEST_T(child_exit_runs_destructors_while_threads_allocate, 60) { exit_mid_allocation(1); }

/* ------------------------------------------------------------------ */
/* Thread churn                                                        */
/* ------------------------------------------------------------------ */

#define CHURN_POOL 1024
static _Atomic(void *) churn_pool[CHURN_POOL];
static _Atomic uint64_t churn_alloc, churn_free;

static void *churn_thread(void *arg) {
  uint64_t seed = (uintptr_t)arg * 0x9E3779B97F4A7C15ull + 1;
  void *mine[8];
  for (int i = 0; i < 8; i++) {
    unsigned k = (unsigned)(rnd(&seed) % 100);
    size_t size = k < 80 ? 16 + rnd(&seed) % 1024 : k < 98 ? rnd(&seed) % 32768 + 1 : rnd(&seed) % 300000 + 1;
    mine[i] = malloc(size);
    if (!mine[i]) abort();
    memset(mine[i], 0x3C, size < 64 ? size : 64);
  }
  atomic_fetch_add_explicit(&churn_alloc, 8, memory_order_relaxed);
  /* half are left for others; blocks left by earlier threads are freed */
  int freed = 0;
  for (int i = 0; i < 4; i++) {
    void *old = atomic_exchange(&churn_pool[rnd(&seed) % CHURN_POOL], mine[i]);
    if (old) {
      if (*(unsigned char *)old != 0x3C) abort();
      free(old);
      freed++;
    }
  }
  for (int i = 4; i < 8; i++) free(mine[i]);
  atomic_fetch_add_explicit(&churn_free, 4 + freed, memory_order_relaxed);
  return NULL;
}

TEST_T(thread_churn_short_threads_rss_bounded, 120) {
  size_t total = env_size("HAK_FAULTS_CHURN_THREADS", 100000);
  enum { BATCH = 64 };
  pthread_t th[BATCH];
  double t0 = th_now();
  size_t done = 0;
  while (done < total) {
    int n = 0;
    for (; n < BATCH && done + n < total; n++)
      REQUIRE(pthread_create(&th[n], NULL, churn_thread, (void *)(uintptr_t)(done + n)) == 0);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    done += n;
  }
  for (int i = 0; i < CHURN_POOL; i++) {
    void *p = atomic_exchange(&churn_pool[i], NULL);
    if (p) free(p), atomic_fetch_add(&churn_free, 1);
  }
  size_t hwm = proc_status("VmHWM");
  printf("    %zu threads in %.2fs: %llu allocations, %llu frees, peak RSS %.1f MiB (bound %d MiB)\n", total,
         th_now() - t0, (unsigned long long)churn_alloc, (unsigned long long)churn_free, hwm / (double)MiB,
         CHURN_HWM_MB);
  CHECK(churn_alloc == churn_free);
  CHECK_MSG(hwm < (size_t)CHURN_HWM_MB * MiB, "peak RSS %zu MiB", hwm / MiB);
}

/* ------------------------------------------------------------------ */
/* Producer / consumer                                                 */
/* ------------------------------------------------------------------ */

#define PC_CAP 4096
typedef struct { uint64_t magic, seq, size, pad; } pc_hdr_t;
static struct {
  pthread_mutex_t lock;
  pthread_cond_t not_empty, not_full;
  pc_hdr_t *ring[PC_CAP];
  size_t head, count;
  int producers_done;
} pc = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, {0}, 0, 0, 0};
static _Atomic int pc_stop;
static _Atomic uint64_t pc_made, pc_freed, pc_bad;

static unsigned char pc_byte(uint64_t seq) { return (unsigned char)(seq * 131 + 7); }

static void *producer(void *arg) {
  uint64_t seed = 77 + (uintptr_t)arg, seq = (uint64_t)(uintptr_t)arg << 40;
  while (!atomic_load_explicit(&pc_stop, memory_order_relaxed)) {
    unsigned k = (unsigned)(rnd(&seed) % 1000);
    size_t size = sizeof(pc_hdr_t) + (k < 900 ? rnd(&seed) % 2048 : k < 995 ? rnd(&seed) % 65536 : rnd(&seed) % MiB);
    pc_hdr_t *h = malloc(size);
    if (!h) abort();
    h->magic = 0xFEEDFACECAFEBEEFull;
    h->seq = ++seq;
    h->size = size;
    memset(h + 1, pc_byte(seq), size - sizeof *h);
    atomic_fetch_add_explicit(&pc_made, 1, memory_order_relaxed);
    pthread_mutex_lock(&pc.lock);
    while (pc.count == PC_CAP) pthread_cond_wait(&pc.not_full, &pc.lock);
    pc.ring[(pc.head + pc.count++) % PC_CAP] = h;
    pthread_cond_signal(&pc.not_empty);
    pthread_mutex_unlock(&pc.lock);
  }
  return NULL;
}

static void *consumer(void *arg) {
  for (;;) {
    pthread_mutex_lock(&pc.lock);
    while (pc.count == 0 && !pc.producers_done) pthread_cond_wait(&pc.not_empty, &pc.lock);
    if (pc.count == 0) {
      pthread_mutex_unlock(&pc.lock);
      return NULL;
    }
    pc_hdr_t *h = pc.ring[pc.head];
    pc.head = (pc.head + 1) % PC_CAP;
    pc.count--;
    pthread_cond_signal(&pc.not_full);
    pthread_mutex_unlock(&pc.lock);
    int ok = h->magic == 0xFEEDFACECAFEBEEFull;
    if (ok) {
      unsigned char c = pc_byte(h->seq), *b = (unsigned char *)(h + 1);
      size_t n = h->size - sizeof *h;
      for (size_t i = 0; i < n; i += 61)
        if (b[i] != c) ok = 0;
      if (n && b[n - 1] != c) ok = 0;
    }
    if (!ok) atomic_fetch_add(&pc_bad, 1);
    free(h);
    atomic_fetch_add_explicit(&pc_freed, 1, memory_order_relaxed);
  }
}

TEST_T(producer_consumer_rss_bounded_no_block_lost, 180) {
  double secs = (double)env_size("HAK_FAULTS_PC_SECONDS", 10);
  size_t in_use_before = in_use_bytes();
  pthread_t prod[2], cons[2];
  for (int i = 0; i < 2; i++) {
    REQUIRE(pthread_create(&prod[i], NULL, producer, (void *)(uintptr_t)i) == 0);
    REQUIRE(pthread_create(&cons[i], NULL, consumer, NULL) == 0);
  }
  double t0 = th_now();
  size_t max_rss = 0, rss_at_2s = 0;
  while (th_now() - t0 < secs) {
    usleep(50000);
    size_t rss = proc_status("VmRSS");
    if (rss > max_rss) max_rss = rss;
    if (!rss_at_2s && th_now() - t0 >= 2) rss_at_2s = rss;
  }
  atomic_store(&pc_stop, 1);
  for (int i = 0; i < 2; i++) pthread_join(prod[i], NULL);
  pthread_mutex_lock(&pc.lock);
  pc.producers_done = 1;
  pthread_cond_broadcast(&pc.not_empty);
  pthread_mutex_unlock(&pc.lock);
  for (int i = 0; i < 2; i++) pthread_join(cons[i], NULL);
  printf("    %.0fs: %llu blocks made, %llu verified and freed, %llu bad; RSS max %.1f MiB "
         "(at 2 s %.1f MiB, bound %d MiB)\n",
         secs, (unsigned long long)pc_made, (unsigned long long)pc_freed, (unsigned long long)pc_bad,
         max_rss / (double)MiB, rss_at_2s / (double)MiB, PC_RSS_MB);
  CHECK(pc_made == pc_freed);
  CHECK(pc_bad == 0);
  /* every block freed by another thread than its maker's went back (the
   * trim collects what waits in the lists of the makers' ended heaps) */
  malloc_trim(0);
  size_t in_use = in_use_bytes();
  CHECK_MSG(in_use < in_use_before + (64u << 10), "%zu bytes in use after, %zu before", in_use,
            in_use_before);
  CHECK(pc_made > 1000);
  CHECK_MSG(max_rss < (size_t)PC_RSS_MB * MiB, "RSS reached %zu MiB", max_rss / MiB);
}

int main(int argc, char **argv) {
#if defined(__x86_64__)
  if (argc > 1 && strcmp(argv[1], "--service-child") == 0) return service_child();
#endif
  return th_main("faults", argc, argv);
}
