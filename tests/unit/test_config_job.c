/* The job settings a worker sends and a shard compares at the handshake (ts_config_job.h):
 * their spelling, which are sent for which mode and optimizer, and the comparison. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ts_config.h"
#include "ts_config_job.h"

static void load(ts_config_t *cfg, const char *const *sets, size_t n) {
  char err[512] = "";
  int rc = ts_config_load(cfg, NULL, NULL, sets, n, err, sizeof err);
  if (rc != 0) fprintf(stderr, "%s\n", err);
  assert_int_equal(rc, 0);
}

static const char *value_of(const ts_config_job_setting_t *s, size_t n, const char *key) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(s[i].key, key) == 0) return s[i].value;
  return NULL;
}

static void test_spelling(void **state) {
  (void)state;
  ts_config_t cfg;
  const char *sets[] = {"cluster.workers=[\"127.0.0.1:1\", \"127.0.0.1:2\"]",
                        "optimizer.name=momentum", "optimizer.learning_rate=0.1",
                        "model.layers=[784, 32, 10]"};
  load(&cfg, sets, 4);
  ts_config_job_setting_t s[TS_CONFIG_JOB_MAX];
  size_t n = ts_config_job_settings(&cfg, s);
  assert_string_equal(s[0].key, "job.mode");
  assert_string_equal(s[0].value, "\"sync\"");
  assert_string_equal(value_of(s, n, "cluster.workers"), "2 workers");
  assert_string_equal(value_of(s, n, "job.replicas_to_aggregate"), "0");
  assert_null(value_of(s, n, "job.staleness")); /* ssp only */
  assert_string_equal(value_of(s, n, "optimizer.name"), "\"momentum\"");
  assert_string_equal(value_of(s, n, "optimizer.learning_rate"), "0.1");
  assert_string_equal(value_of(s, n, "optimizer.momentum"), "0.9");
  assert_null(value_of(s, n, "optimizer.beta1")); /* adam only */
  assert_string_equal(value_of(s, n, "model.layers"), "[784, 32, 10]");
  assert_string_equal(value_of(s, n, "job.partition_bytes"), "4194304");
  assert_string_equal(value_of(s, n, "optimizer.decay"), "\"none\"");
  assert_null(value_of(s, n, "optimizer.decay_steps")); /* with a decay only */
  ts_config_free(&cfg);
}

/* model.layers as a layer list: loaded into net_layers (the widths cleared), and sent in one
 * canonical line in which omitted defaults and the same defaults written out compare equal. */
static void test_layer_list(void **state) {
  (void)state;
  ts_config_t a, b;
  const char *sa[] = {
      "model.layers=({type=\"conv2d\"; filters=6; kernel=5; padding=\"same\"; "
      "activation=\"relu\";}, {type=\"max_pool\"; size=2;}, {type=\"flatten\";}, "
      "{type=\"dropout\"; rate=0.25;}, {type=\"dense\"; units=10;})"};
  const char *sb[] = {
      "model.layers=({type=\"conv2d\"; filters=6; kernel=[5, 5]; strides=1; "
      "padding=\"same\"; activation=\"relu\"; name=\"conv1\";}, "
      "{type=\"max_pool\"; size=2; strides=[2, 2]; padding=\"valid\";}, "
      "{type=\"flatten\";}, {type=\"dropout\"; rate=0.25;}, "
      "{type=\"dense\"; units=10; activation=\"linear\";})"};
  load(&a, sa, 1);
  load(&b, sb, 1);
  assert_int_equal(a.num_net_layers, 5);
  assert_int_equal(a.num_layers, 0);
  ts_config_job_setting_t s[TS_CONFIG_JOB_MAX];
  size_t n = ts_config_job_settings(&a, s);
  assert_string_equal(value_of(s, n, "model.layers"),
                      "conv1=conv2d(6,5x5,1x1,same,relu); pool1=max_pool(2x2,2x2,valid); "
                      "flatten1=flatten(); dropout1=dropout(0.25); fc1=dense(10,linear)");
  char own[TS_CONFIG_JOB_VALUE_LEN];
  assert_int_equal(
      ts_config_job_compare(&b, "model.layers", value_of(s, n, "model.layers"), own, sizeof own),
      1);
  /* The widths differ from any layer list. */
  assert_int_equal(ts_config_job_compare(&b, "model.layers", "[784, 128, 10]", own, sizeof own), 0);
  ts_config_free(&a);
  ts_config_free(&b);
}

/* The learning rate's schedule is shared: its keys are sent as far as the schedule uses
 * them, and a shard with another schedule refuses. */
static void test_decay(void **state) {
  (void)state;
  ts_config_t cos_cfg, exp_cfg;
  const char *a[] = {"optimizer.decay=cosine", "optimizer.decay_steps=928",
                     "optimizer.decay_alpha=0.1"};
  const char *b[] = {"optimizer.decay=exponential", "optimizer.decay_steps=100",
                     "optimizer.staircase=true"};
  load(&cos_cfg, a, 3);
  load(&exp_cfg, b, 3);
  ts_config_job_setting_t s[TS_CONFIG_JOB_MAX];
  size_t n = ts_config_job_settings(&cos_cfg, s);
  assert_string_equal(value_of(s, n, "optimizer.decay"), "\"cosine\"");
  assert_string_equal(value_of(s, n, "optimizer.decay_steps"), "928");
  assert_string_equal(value_of(s, n, "optimizer.decay_alpha"), "0.1");
  assert_null(value_of(s, n, "optimizer.decay_rate")); /* exponential only */
  n = ts_config_job_settings(&exp_cfg, s);
  assert_string_equal(value_of(s, n, "optimizer.decay_rate"), "0.96");
  assert_string_equal(value_of(s, n, "optimizer.staircase"), "true");
  assert_null(value_of(s, n, "optimizer.decay_alpha"));
  char own[TS_CONFIG_JOB_VALUE_LEN];
  assert_int_equal(ts_config_job_compare(&cos_cfg, "optimizer.decay",
                                         value_of(s, n, "optimizer.decay"), own, sizeof own),
                   0);
  assert_string_equal(own, "\"cosine\"");
  assert_int_equal(ts_config_job_compare(&cos_cfg, "optimizer.decay_steps", "100", own, sizeof own),
                   0);
  assert_string_equal(own, "928");
  ts_config_free(&cos_cfg);
  ts_config_free(&exp_cfg);
}

static void test_compare(void **state) {
  (void)state;
  ts_config_t mine, theirs;
  const char *a[] = {"job.mode=sync"};
  const char *b[] = {"job.mode=async", "optimizer.learning_rate=0.05"};
  load(&mine, a, 1);
  load(&theirs, b, 2);
  ts_config_job_setting_t s[TS_CONFIG_JOB_MAX];
  size_t n = ts_config_job_settings(&theirs, s);
  char own[TS_CONFIG_JOB_VALUE_LEN];
  /* The first difference is the mode, sent first. */
  assert_int_equal(ts_config_job_compare(&mine, s[0].key, s[0].value, own, sizeof own), 0);
  assert_string_equal(own, "\"sync\"");
  assert_string_equal(s[0].value, "\"async\"");
  assert_int_equal(
      ts_config_job_compare(&mine, "optimizer.learning_rate",
                            value_of(s, n, "optimizer.learning_rate"), own, sizeof own),
      0);
  assert_string_equal(own, "0.1");
  /* Equal values, and a key this version does not know, pass. */
  assert_int_equal(ts_config_job_compare(&mine, "model.layers", "[784, 128, 10]", own, sizeof own),
                   1);
  assert_int_equal(ts_config_job_compare(&mine, "job.future_key", "x", own, sizeof own), 1);
  /* A key that is not a job setting is never compared. */
  assert_int_equal(ts_config_job_compare(&mine, "train.batch_size", "1", own, sizeof own), 1);
  ts_config_free(&mine);
  ts_config_free(&theirs);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_spelling),
      cmocka_unit_test(test_compare),
      cmocka_unit_test(test_layer_list),
      cmocka_unit_test(test_decay),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
