/*
 * Every metric docs/operations.md names exists in a real /metrics (issue 30, "Right
 * numbers": the doc named result="failed" where the shard says result="error"):
 * the names (tessera_ps_* on a shard, tessera_worker_* on a worker, others on either) and
 * each label value the doc spells out (`{result="ok\|refused"}`: both), scraped from a
 * shard with checkpoints on, a worker training and a worker that has finished (its test
 * results) while the other trains on.
 */
#include <ctype.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#define DATA "/usr/share/datasets/fashion-mnist/"

static char shard_body[1 << 20], train_body[1 << 20], done_body[1 << 20];

/* Whether a sample line of metric `name` (or its histogram's _bucket/_sum/_count) in body
 * holds `label` ("" for any). A name ending in '_' (the doc's `tessera_ps_admin_*`) is a
 * prefix. */
static bool has_sample(const char *body, const char *name, const char *label) {
  size_t n = strlen(name);
  for (const char *l = body; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
    if (*l == '#' || strncmp(l, name, n) != 0) continue;
    const char *rest = l + n;
    if (name[n - 1] != '_') {
      if (strncmp(rest, "_bucket", 7) == 0) rest += 7;
      else if (strncmp(rest, "_count", 6) == 0) rest += 6;
      else if (strncmp(rest, "_sum", 4) == 0) rest += 4;
      if (*rest != ' ' && *rest != '{') continue;
    }
    const char *end = strchr(l, '\n');
    size_t len = end ? (size_t)(end - l) : strlen(l);
    if (!*label) return true;
    char line[1024];
    snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), l);
    if (strstr(line, label)) return true;
  }
  return false;
}

/* Checks one mention: name and its braces' text (may be ""). Returns the problems found. */
static int check_mention(const char *name, const char *labels) {
  const char *bodies[3];
  int nb = 0;
  if (strncmp(name, "tessera_ps_", 11) == 0) {
    bodies[nb++] = shard_body;
  } else if (strncmp(name, "tessera_worker_", 15) == 0) {
    bodies[nb++] = train_body;
    bodies[nb++] = done_body;
  } else {
    bodies[nb++] = shard_body;
    bodies[nb++] = train_body;
  }
  /* The label requirements: `k="a\|b"` asks for k="a" and k="b"; a bare `k` for k="...". */
  char req[32][160];
  int nreq = 0;
  char copy[512];
  snprintf(copy, sizeof copy, "%s", labels);
  for (char *item = strtok(copy, ","); item && nreq < 32; item = strtok(NULL, ",")) {
    while (isspace((unsigned char)*item)) item++;
    char *eq = strchr(item, '=');
    if (!eq) {
      snprintf(req[nreq++], sizeof req[0], "%s=\"", item);
      continue;
    }
    *eq = 0;
    char *v = eq + 1;
    if (*v == '"') v++;
    char *close = strrchr(v, '"');
    if (close) *close = 0;
    for (char *alt = v; alt && nreq < 32;) {
      char *bar = strstr(alt, "\\|");
      if (bar) *bar = 0;
      snprintf(req[nreq++], sizeof req[0], "%s=\"%s\"", item, alt);
      alt = bar ? bar + 2 : NULL;
    }
  }
  if (nreq == 0) snprintf(req[nreq++], sizeof req[0], "%s", "");
  int problems = 0;
  for (int i = 0; i < nreq; i++) {
    bool found = false;
    for (int b = 0; b < nb && !found; b++) found = has_sample(bodies[b], name, req[i]);
    if (!found) {
      fprintf(stderr, "docs/operations.md names %s{%s}: no such sample in /metrics (%s)\n", name,
              labels, req[i][0] ? req[i] : "the name");
      problems++;
    }
  }
  return problems;
}

static void test_doc_metrics_exist(void **state) {
  (void)state;
  if (access(DATA "t10k-images-idx3-ubyte.gz", R_OK) != 0)
    TS_SKIP("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)");
  char *doc = ts_read_file(TS_SOURCE_ROOT "/docs/operations.md");
  assert_non_null(doc);
  char ckpt[] = "/tmp/tessera-docs-metrics-XXXXXX", job[512];
  assert_non_null(mkdtemp(ckpt));
  snprintf(job, sizeof job,
           "job = { mode = \"sync\"; };\n"
           "model = { layers = [784, 16, 10]; };\n"
           "checkpoint = { dir = \"%s\"; interval_s = 1; };\n"
           "train = { batch_size = 32; epochs = 200; log_interval_s = 0.2; };",
           ckpt);
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 2, job), 0);
  /* Worker 0 stops at step 20 and waits for worker 1 (its test results on /metrics);
   * worker 1 trains on (200 epochs: a fast host trains one in 0.1 s, and the worker would
   * be done before its training metrics are read). */
  const char *short_run[] = {"--set", "train.max_steps=20", NULL};
  const char *long_run[] = {"--set", "train.max_steps=100000", NULL};
  ts_proc_t w0, w1;
  assert_int_equal(ts_worker_start(&c, 0, short_run, &w0), 0);
  assert_int_equal(ts_worker_start(&c, 1, long_run, &w1), 0);
  assert_true(ts_proc_wait_log(&w0, "waiting for 1 other worker(s) to finish", 120));
  assert_true(ts_metric_wait(c.worker_port[0], "tessera_worker_test_loss", 0, 1e9) >= 0);
  assert_int_equal(ts_http_get(c.worker_port[0], "/metrics", done_body, sizeof done_body, NULL, 0), 200);
  assert_true(ts_metric_wait(c.worker_port[1], "tessera_worker_loss", 1e-9, 1e9) > 0);
  assert_int_equal(ts_http_get(c.worker_port[1], "/metrics", train_body, sizeof train_body, NULL, 0), 200);
  /* A checkpoint written (its timestamp and duration on /metrics). */
  assert_true(ts_metric_wait(c.http_port[0], "tessera_ps_checkpoints_total{result=\"ok\"}", 1, 1e9) >= 1);
  assert_int_equal(ts_http_get(c.http_port[0], "/metrics", shard_body, sizeof shard_body, NULL, 0), 200);
  kill(w1.pid, SIGTERM);
  kill(w0.pid, SIGTERM);
  ts_proc_wait(&w1, 60);
  ts_proc_wait(&w0, 60);

  int mentions = 0, problems = 0;
  for (const char *p = strstr(doc, "tessera_"); p; p = strstr(p + 1, "tessera_")) {
    if (p > doc && (isalnum((unsigned char)p[-1]) || p[-1] == '_' || p[-1] == '/' ||
                    p[-1] == '-' || p[-1] == '.'))
      continue; /* part of a longer word or a path (libtessera_client, tessera_ps.conf) */
    size_t n = 0;
    while (islower((unsigned char)p[n]) || isdigit((unsigned char)p[n]) || p[n] == '_') n++;
    if (n < 10 || !(strncmp(p, "tessera_ps_", 11) == 0 || strncmp(p, "tessera_worker_", 15) == 0 ||
                    strncmp(p, "tessera_build_", 14) == 0))
      continue;
    char name[128], labels[512] = "";
    snprintf(name, sizeof name, "%.*s", (int)n, p);
    if (p[n] == '{') {
      const char *close = strchr(p + n, '}');
      if (close) snprintf(labels, sizeof labels, "%.*s", (int)(close - p - n - 1), p + n + 1);
    }
    mentions++;
    /* A CTR model's only: system ctr reads them on a CTR worker's /metrics. */
    if (strcmp(name, "tessera_worker_auc") == 0 || strcmp(name, "tessera_worker_test_auc") == 0)
      continue;
    problems += check_mention(name, labels);
  }
  fprintf(stderr, "%d metric mentions in docs/operations.md checked, %d not on /metrics\n",
          mentions, problems);
  assert_true(mentions > 50);
  assert_int_equal(problems, 0);
  free(doc);
  assert_int_equal(ts_cluster_stop(&c), 0);
  char rm[600];
  snprintf(rm, sizeof rm, "rm -rf '%s'", ckpt);
  assert_int_equal(system(rm), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_doc_metrics_exist),
  };
  return ts_skip_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
