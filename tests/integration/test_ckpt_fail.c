/*
 * Checkpoints that fail never stop silently. The fault: checkpoint.dir replaced by a
 * regular file after the shard started (the write then fails in open(2), as it would for
 * a directory made unwritable or a full disk: the same path of ts_ckpt_file_write; a
 * chmod would not stop root, and mounting a tiny tmpfs needs privileges a test does not
 * have). While checkpoints fail, psctl health exits 1 and psctl status, /readyz and
 * /status show "last checkpoint: failed N× (Not a directory)"; a failed checkpoint does
 * not count as saved: the timer writes it once the directory works again, and SIGTERM
 * writes a final one; when SIGTERM cannot, the shard says which steps are lost.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "calls.h"
#include "harness.h"

#define N 1000
static const uint64_t shape[] = {N};
static const ts_client_tensor_t model[] = {
    {.name = "w", .shape = shape, .rank = 1, .init = TS_CLIENT_INIT_ZEROS}};

static char out[65536], err[65536];

static ts_client_t *open_client(ts_cluster_t *c, bool admin) {
  ts_client_t *cl = tc_open_role(c->addrs, 1, admin, model, 1, 3);
  assert_non_null(cl);
  return cl;
}

/* Shard 0's checkpoint state: failures in a row, checkpoints written, restored step. */
static void ckpt_state(ts_cluster_t *c, uint32_t *failures, uint64_t *written, uint64_t *restored) {
  ts_client_t *a = open_client(c, true);
  ts_client_shard_status_t *st = NULL;
  char e[512];
  assert_int_equal(ts_client_status(a, 0, &st, e, sizeof e), 0);
  if (failures) *failures = st->checkpoint_failures;
  if (written) *written = st->checkpoints_written;
  if (restored) *restored = st->restored_step;
  ts_client_status_free(st);
  ts_client_close(a);
}

/* Wait (up to 30 s) until shard 0 has failed at least `want` checkpoints in a row
 * (want > 0) or its last one worked and it has written at least `written` (want == 0). */
static void wait_ckpt(ts_cluster_t *c, uint32_t want, uint64_t written) {
  uint32_t f = 0;
  uint64_t w = 0;
  for (int i = 0; i < 3000; i++) {
    ckpt_state(c, &f, &w, NULL);
    if (want ? f >= want : f == 0 && w >= written) return;
    ts_sleep_ms(10);
  }
  fprintf(stderr, "waited for %u failure(s) / %llu written: %u failure(s), %llu written\n", want,
          (unsigned long long)written, f, (unsigned long long)w);
  fail();
}

/* Replace dir by a regular file (the directory kept at dir.away), or put it back. */
static void break_dir(const char *dir, bool broken) {
  char away[400];
  snprintf(away, sizeof away, "%s.away", dir);
  if (broken) {
    assert_int_equal(rename(dir, away), 0);
    FILE *f = fopen(dir, "w");
    assert_non_null(f);
    fclose(f);
  } else {
    assert_int_equal(unlink(dir), 0);
    assert_int_equal(rename(away, dir), 0);
  }
}

static void start(ts_cluster_t *c, char *dir, const char *interval) {
  char job[700];
  assert_non_null(mkdtemp(dir));
  snprintf(job, sizeof job,
           "job = { mode = \"async\"; };\noptimizer = { name = \"sgd\"; learning_rate = 0.5; };\n"
           "checkpoint = { dir = \"%s\"; interval_s = %s; keep = 3; };",
           dir, interval);
  assert_int_equal(ts_cluster_start(c, 1, 1, job), 0);
}

static void cleanup(ts_cluster_t *c, const char *dir) {
  assert_int_equal(ts_cluster_stop(c), 0);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s.away'", dir, dir);
  assert_int_equal(system(cmd), 0);
}

/* The timer: failures shown everywhere, and retried once the directory works again. */
static void test_failures_shown_and_retried(void **state) {
  (void)state;
  char dir[] = "/tmp/tessera-ckpt-fail-XXXXXX";
  ts_cluster_t c;
  start(&c, dir, "0.2");
  ts_client_t *w = open_client(&c, false);
  assert_int_equal(tc_push_filled(w, 1.0f, N, 3), 0);
  wait_ckpt(&c, 0, 1);
  uint64_t written = 0;
  ckpt_state(&c, NULL, &written, NULL);

  break_dir(dir, true);
  assert_int_equal(tc_push_filled(w, 1.0f, N, 2), 0); /* step 5, not on disk */
  wait_ckpt(&c, 2, 0);
  const char *health[] = {ts_psctl_path, "-c", c.config, "health", NULL};
  int rc = ts_run_capture(health, out, sizeof out, err, sizeof err);
  if (rc != 1 || !strstr(out, "Not a directory")) fprintf(stderr, "health %d: %s%s", rc, out, err);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(out, "unhealthy: 1 of 1 shard(s) up"));
  assert_non_null(strstr(out, "shard 0: last checkpoint: failed "));
  assert_non_null(strstr(out, "\u00d7 (Not a directory)"));
  const char *status[] = {ts_psctl_path, "-c", c.config, "status", NULL};
  assert_int_equal(ts_run_capture(status, out, sizeof out, err, sizeof err), 0);
  assert_non_null(strstr(out, "shard 0: last checkpoint: failed "));
  const char *json[] = {ts_psctl_path, "-c", c.config, "-o", "json", "health", NULL};
  assert_int_equal(ts_run_capture(json, out, sizeof out, err, sizeof err), 1);
  assert_non_null(strstr(out, "\"healthy\":\tfalse") ? out : strstr(out, "\"healthy\": false"));
  assert_non_null(strstr(out, "Not a directory"));
  /* /readyz stays 200 (the shard serves) and says it; /status holds it too (published
   * every 250 ms). */
  bool said = false;
  for (int i = 0; i < 200 && !said; i++) {
    char body[1024];
    int code = ts_http_get(c.http_port[0], "/readyz", body, sizeof body, NULL, 0);
    said = code == 200 && strstr(body, "last checkpoint: failed") && strstr(body, "Not a directory");
    if (!said) ts_sleep_ms(20);
  }
  assert_true(said);

  /* The directory back: the timer writes the state it failed to save, though nothing
   * changed since. */
  break_dir(dir, false);
  wait_ckpt(&c, 0, written + 1);
  assert_int_equal(ts_run_capture(health, out, sizeof out, err, sizeof err), 0);
  assert_null(strstr(out, "last checkpoint"));
  assert_true(ts_cluster_log_has(&c, 0, "checkpoint written after"));
  ts_client_close(w);
  ts_cluster_signal(&c, 0, SIGKILL);
  assert_int_equal(ts_cluster_start_shard(&c, 0), 0);
  uint64_t restored = 0;
  ckpt_state(&c, NULL, NULL, &restored);
  assert_int_equal(restored, 5);
  cleanup(&c, dir);
}

/* SIGTERM after a failed checkpoint: it writes the final one when it can, and when it
 * cannot it says which steps are lost. */
static void test_sigterm_after_failure(void **state) {
  (void)state;
  char dir[] = "/tmp/tessera-ckpt-term-XXXXXX", path[600];
  ts_cluster_t c;
  start(&c, dir, "3600");
  ts_client_t *w = open_client(&c, false);
  assert_int_equal(tc_push_filled(w, 1.0f, N, 3), 0);
  assert_int_equal(tc_checkpoint(c.addrs, 1, 0, path, sizeof path), 0); /* step 3 */
  break_dir(dir, true);
  assert_int_equal(tc_push_filled(w, 1.0f, N, 2), 0);
  assert_true(tc_checkpoint(c.addrs, 1, 0, path, sizeof path) < 0); /* step 5 failed */
  ts_client_close(w);
  break_dir(dir, false);
  /* The failed one counts as unsaved: SIGTERM writes it. */
  ts_cluster_signal(&c, 0, SIGTERM);
  assert_int_equal(c.bad_exits, 0);
  assert_true(ts_cluster_log_has(&c, 0, "writing a final checkpoint before stopping"));
  assert_int_equal(ts_cluster_start_shard(&c, 0), 0);
  uint64_t restored = 0;
  ckpt_state(&c, NULL, NULL, &restored);
  assert_int_equal(restored, 5);

  /* It cannot: three attempts, then what is lost, exactly. */
  w = open_client(&c, false);
  assert_int_equal(tc_push_filled(w, 1.0f, N, 2), 0); /* step 7 */
  ts_client_close(w);
  break_dir(dir, true);
  ts_cluster_signal(&c, 0, SIGTERM);
  assert_true(ts_cluster_log_has(&c, 0, "(attempt 3 of 3)"));
  assert_true(ts_cluster_log_has(&c, 0, "stopping WITHOUT a checkpoint of steps 5 -> 7"));
  assert_true(ts_cluster_log_has(&c, 0, "holds step 5"));
  break_dir(dir, false);
  assert_int_equal(ts_cluster_start_shard(&c, 0), 0);
  cleanup(&c, dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_failures_shown_and_retried),
      cmocka_unit_test(test_sigterm_after_failure),
  };
  return cmocka_run_group_tests_name("ckpt_fail", tests, NULL, NULL);
}
