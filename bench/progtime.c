/* progtime — a real program as a workload of the matrix (bench/run --set
 * programs, make bench-programs).
 *
 * usage: progtime program [args...]
 *   Runs the program with progtime's own environment (so the allocator
 *   under test reaches it through the LD_PRELOAD that progtime inherits),
 *   its stdout to /dev/null, and waits for it. Prints one result line whose
 *   ops/s is runs per second, 1 / the program's wall time. A program that
 *   cannot start, is killed or exits nonzero fails the run (exit 1), so a
 *   crash under an allocator never counts as a time.
 * Use `env NAME=VALUE program` to set a variable for the program only.
 */
#include "bench_common.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

static const char usage[] = "usage: progtime program [args...]\n";

int main(int argc, char **argv) {
  if (bench_want_help(argc, argv, usage)) return 0;
  if (argc < 2) {
    fputs(usage, stderr);
    return 2;
  }
  double t0 = bench_now();
  pid_t pid = fork();
  if (pid < 0) bench_die("fork failed");
  if (pid == 0) {
    int null = open("/dev/null", O_WRONLY);
    if (null < 0 || dup2(null, STDOUT_FILENO) < 0) _exit(126);
    execvp(argv[1], argv + 1);
    fprintf(stderr, "progtime: cannot run %s: %s\n", argv[1], strerror(errno));
    _exit(127);
  }
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) bench_die("waitpid failed");
  double t = bench_now() - t0;
  if (WIFSIGNALED(status)) {
    fprintf(stderr, "progtime: %s killed by signal %d\n", argv[1], WTERMSIG(status));
    return 1;
  }
  if (WEXITSTATUS(status) != 0) {
    fprintf(stderr, "progtime: %s exited with status %d\n", argv[1], WEXITSTATUS(status));
    return 1;
  }
  printf("progtime program=%s ops=1 ops/s=%.4f time_s=%.3f\n", argv[1], 1 / t, t);
  return 0;
}
