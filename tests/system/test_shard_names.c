/*
 * A worker whose shard is named by a host name (issue 30, "DNS"), through the real
 * ps-server and ps-worker binaries:
 *  - a name that does not resolve is waited for within job.connect_timeout_s, as a refused
 *    connection is: the waiting notices name the shard, the name and the resolver's error,
 *    and at the timeout the worker exits 1 with the same reason;
 *  - a name that resolves only later (the normal start order on Kubernetes: the worker's
 *    pod before the shards' Service names) is picked up and the worker trains. This case
 *    runs the worker in its own mount namespace with a hosts file the test writes over
 *    /etc/hosts; where namespaces are not allowed it is skipped, saying so.
 * Times are printed; the assertions on them are generous (a loaded 2-core machine).
 */
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

/* A name no resolver knows: ".invalid" is reserved for that (RFC 2606). */
#define NOSUCH "tessera-no-such-shard.invalid"

static void test_name_never_resolves(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, "model = { layers = [784, 16, 10]; };"), 0);
  char ps[128], who[160];
  snprintf(ps, sizeof ps, "cluster.ps=[\"" NOSUCH ":%d\"]", c.port[0]);
  snprintf(who, sizeof who, "waiting for shard 0 (" NOSUCH ":%d)", c.port[0]);
  const char *extra[] = {"--set", ps, "--set", "job.connect_timeout_s=7", NULL};
  ts_proc_t w;
  assert_int_equal(ts_worker_start(&c, 0, extra, &w), 0);
  assert_true(ts_proc_wait_log(&w, "connecting to 1 shard", 30));
  double t0 = ts_now_s();
  int st = ts_proc_wait(&w, 60);
  double took = ts_now_s() - t0;
  fprintf(stderr, "unresolvable shard name, job.connect_timeout_s = 7: exit %d after %.2f s\n", st,
          took);
  if (st != 1) ts_proc_dump(&w);
  /* Before: exit 1 at once ("shard 0: cannot resolve ..."), no wait. */
  assert_int_equal(st, 1);
  assert_true(took >= 6.0 && took <= 30.0);
  /* The waiting notice (every 5 s) names the shard, the name and why. */
  assert_true(ts_file_count(w.err, who) >= 1);
  assert_true(ts_file_has(w.err, "cannot resolve '" NOSUCH "'"));
  assert_true(ts_file_has(w.err, "gave up after 7 s (job.connect_timeout_s)"));
  char *log = ts_read_file(w.err);
  const char *gave_up = log ? strstr(log, "gave up after") : NULL;
  assert_non_null(gave_up);
  assert_non_null(strstr(gave_up, "cannot resolve '" NOSUCH "'"));
  free(log);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* In a child: a private mount namespace whose /etc/hosts is the file `arg`. Returns 0, or
 * -1. */
static int private_hosts(void *arg) {
  const char *hosts = arg;
  if (unshare(CLONE_NEWNS) < 0 && unshare(CLONE_NEWUSER | CLONE_NEWNS) < 0) return -1;
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return -1;
  return mount(hosts, "/etc/hosts", NULL, MS_BIND, NULL);
}

static bool namespaces_allowed(const char *hosts) {
  pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) _exit(private_hosts((void *)hosts) == 0 ? 0 : 1);
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static void test_name_resolves_later(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1,
                                    "job = { mode = \"sync\"; };\n"
                                    "model = { layers = [784, 16, 10]; };\n"
                                    "train = { batch_size = 64; max_steps = 20; };"),
                   0);
  char hosts[320];
  snprintf(hosts, sizeof hosts, "%s/hosts", c.dir);
  FILE *f = fopen(hosts, "w");
  assert_non_null(f);
  fputs("127.0.0.1 localhost\n", f);
  fclose(f);
  if (!namespaces_allowed(hosts)) {
    assert_int_equal(ts_cluster_stop(&c), 0);
    TS_SKIP("no private mount namespace here (unshare(CLONE_NEWNS) refused): the name that "
            "resolves later is not checked");
  }
  char ps[128];
  snprintf(ps, sizeof ps, "cluster.ps=[\"tessera-shard-later:%d\"]", c.port[0]);
  const char *extra[] = {"--set", ps, "--set", "job.connect_timeout_s=120", NULL};
  ts_proc_t w;
  assert_int_equal(ts_worker_start_with(&c, 0, extra, &w, private_hosts, hosts), 0);
  bool waiting = ts_proc_wait_log(&w, "cannot resolve 'tessera-shard-later'", 60);
  if (!waiting) ts_proc_dump(&w);
  assert_true(waiting);
  /* The name appears, as a Service's does once its pods exist: the same file, written in
   * place (the bind mount holds its inode). */
  f = fopen(hosts, "a");
  assert_non_null(f);
  fputs("127.0.0.1 tessera-shard-later\n", f);
  fclose(f);
  int st = ts_proc_wait(&w, 120);
  if (st != 0) ts_proc_dump(&w);
  assert_int_equal(st, 0);
  char *out = ts_read_file(w.out);
  assert_non_null(out);
  assert_non_null(strstr(out, "done: task=0 steps=20 "));
  free(out);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_name_never_resolves),
      cmocka_unit_test(test_name_resolves_later),
  };
  return ts_skip_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
