/* Unit tests of config/ts_config's key table: the defaults, every key's type, bounds and
 * allowed values (the refusal messages and the edges that are allowed), unknown keys with
 * their suggestions, and the reference generated from the table. Loading from files,
 * TF_CONFIG and --set is in test_config.c. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_fixtures.h"

static void test_defaults(void **state) {
  (void)state;
  ts_config_t cfg;
  assert_int_equal(ts_config_defaults(&cfg), 0);
  check_defaults(&cfg);
  assert_string_equal(cfg.source, "-");
  ts_config_free(&cfg);

  /* No file, no TF_CONFIG, no overrides: the defaults, and they pass cross-key rules. */
  expect_ok(&cfg, NULL, NULL, NULL, 0);
  check_defaults(&cfg);
  ts_config_free(&cfg);
  ts_config_free(&cfg); /* freeing twice is harmless */
  ts_config_free(NULL);
}

struct bad {
  const char *text;
  int line;
  const char *needle;
};

static void expect_all(const struct bad *b, size_t n) {
  for (size_t i = 0; i < n; i++) expect_error(b[i].text, b[i].line, NULL, NULL, 0, b[i].needle);
}

static void test_type_errors(void **state) {
  (void)state;
  static const struct bad cases[] = {
      {"job = { mode = 1; };", 1, "job.mode: must be a string, not an integer (1)"},
      {"\ntrain = {\n batch_size = \"64\"; };", 3,
       "train.batch_size: must be an integer, not a string (\"64\")"},
      {"train = { batch_size = 6.5; };", 1,
       "train.batch_size: must be an integer, not a float (6.5)"},
      {"model = { seed = 1.0; };", 1, "model.seed: must be an integer, not a float"},
      {"job = { partition_bytes = true; };", 1,
       "job.partition_bytes: must be an integer, not a boolean"},
      {"device = { allow_growth = 1; };", 1,
       "device.allow_growth: must be true or false, not an integer (1)"},
      {"device = { allow_growth = \"yes\"; };", 1, "must be true or false, not a string"},
      {"optimizer = { learning_rate = \"x\"; };", 1,
       "optimizer.learning_rate: must be a number, not a string"},
      {"optimizer = { learning_rate = [1]; };", 1, "must be a number, not an array"},
      {"cluster = { ps = \"127.0.0.1:1\"; };", 1,
       "cluster.ps: must be an array of strings, not a string"},
      {"cluster = { ps = (\"127.0.0.1:1\", 2); };", 1,
       "cluster.ps[1]: must be a string, not an integer (2)"},
      {"model = { layers = [\"784\", \"10\"]; };", 1,
       "model.layers[0]: must be an integer, not a string"},
      {"model = { layers = 784; };", 1,
       "model.layers: must be an array of integers or a list of layers, not an integer"},
      {"model = { layers = (784, 1.5); };", 1, "model.layers[1]: must be an integer, not a float"},
      {"job = 3;", 1, "job: must be a group"},
      {"job = { mode = { x = 1; }; };", 1, "job.mode: must be a string, not a group"},
  };
  expect_all(cases, sizeof cases / sizeof cases[0]);
}

static void test_bounds(void **state) {
  (void)state;
  static const struct bad cases[] = {
      {"train = { batch_size = 0; };", 1,
       "train.batch_size: must be an integer in [1, 65536], not 0"},
      {"train = { batch_size = 65537; };", 1, "must be an integer in [1, 65536], not 65537"},
      {"job = { staleness = -1; };", 1, "job.staleness: must be an integer in [0, 65535], not -1"},
      {"job = { min_workers = -1; };", 1, "job.min_workers: must be an integer in [0, "},
      {"job = { partition_bytes = 4194303; };", 1,
       "job.partition_bytes: must be a multiple of 4, not 4194303"},
      {"job = { partition_bytes = 0; };", 1, "must be an integer in [4, 1073741824], not 0"},
      {"server = { max_message_bytes = 17179869185; };", 1,
       "server.max_message_bytes: must be an integer in [1048576, 17179869184], not 17179869185"},
      {"server = { max_model_bytes = 1048575; };", 1,
       "server.max_model_bytes: must be an integer in [1048576, 4398046511104], not 1048575"},
      {"server = { max_table_bytes = 1048575; };", 1,
       "server.max_table_bytes: must be an integer in [1048576, 4398046511104], not 1048575"},
      {"optimizer = { learning_rate = 0.0; };", 1,
       "optimizer.learning_rate: must be a number in (0, 1000], not 0"},
      {"optimizer = { momentum = 1.0; };", 1,
       "optimizer.momentum: must be a number in [0, 1), not 1"},
      {"optimizer = { epsilon = 0; };", 1, "must be a number in (0, 1], not 0"},
      {"optimizer = { decay_steps = 0; };", 1,
       "optimizer.decay_steps: must be an integer in [1, 9223372036854775807], not 0"},
      {"optimizer = { decay_rate = 0.0; };", 1,
       "optimizer.decay_rate: must be a number in (0, 1], not 0"},
      {"optimizer = { decay_rate = 1.5; };", 1, "must be a number in (0, 1], not 1.5"},
      {"optimizer = { decay_alpha = -0.5; };", 1,
       "optimizer.decay_alpha: must be a number in [0, 1], not -0.5"},
      {"device = { intra_op_parallelism_threads = -1; };", 1,
       "device.intra_op_parallelism_threads: must be an integer in [0, 1024], not -1"},
      {"device = { memory_fraction = 1.5; };", 1,
       "device.memory_fraction: must be a number in [0, 1], not 1.5"},
      {"device = { memory_fraction = -0.1; };", 1, "must be a number in [0, 1], not -0.1"},
      {"job = { sync_timeout_s = 0; };", 1,
       "job.sync_timeout_s: must be a number in [0.01, 86400]"},
      {"model = { layers = [784]; };", 1, "model.layers: must have 2 to 64 entries, not 1"},
      {"model = { layers = [784, 0]; };", 1,
       "model.layers[1]: must be an integer in [1, 1048576], not 0"},
      {"cluster = { ps = []; };", 1, "cluster.ps: must have 1 to 256 entries, not 0"},
      {"cluster = { workers = []; };", 1, "cluster.workers: must have 1 to 256 entries, not 0"},
      {"cluster = { ps = [\"127.0.0.1\"]; };", 1,
       "cluster.ps[0]: \"127.0.0.1\" is not host:port with a port in 1..65535"},
      {"cluster = { ps_http = [\"127.0.0.1:0\"]; };", 1,
       "cluster.ps_http[0]: \"127.0.0.1:0\" is not"},
      {"data = { train_images = \"\"; };", 1,
       "data.train_images: must be 1 to 4095 bytes long, not 0"},
      {"device = { placement = \"gpu:0\"; };", 1,
       "device.placement: \"gpu:0\" is not a device name"},
      {"device = { rules = [\"fc1/*\"]; };", 1,
       "is not a rule PATTERN=DEVICE"},
      {"device = { rules = [\"=/cpu:0\"]; };", 1,
       "is not a rule PATTERN=DEVICE"},
      {"device = { rules = [\"fc1=gpu:0\"]; };", 1,
       "is not a rule PATTERN=DEVICE"},
      {"checkpoint = { keep = 0; };", 1, "checkpoint.keep: must be an integer in [1, 1000], not 0"},
      {"server = { max_parked_pulls = 0; };", 1,
       "server.max_parked_pulls: must be an integer in [1, 65536], not 0"},
      {"server = { push_dedup_clients = 65; };", 1,
       "server.push_dedup_clients: must be an integer in [0, 64], not 65"},
      {"server = { max_pull_wait_s = 0.5; };", 1,
       "server.max_pull_wait_s: must be a number in [1, 86400], not 0.5"},
      {"server = { max_reply_bytes_per_connection = 1024; };", 1,
       "server.max_reply_bytes_per_connection: must be an integer in [65536, 17179869184]"},
      {"server = { push_min_bytes_per_s = -1; };", 1,
       "server.push_min_bytes_per_s: must be an integer in [0, 1073741824], not -1"},
      {"server = { push_rate_window_s = 0.01; };", 1,
       "server.push_rate_window_s: must be a number in [0.1, 600]"},
      {"server = { push_contended_min_bytes_per_s = -1; };", 1,
       "server.push_contended_min_bytes_per_s: must be an integer in [0, 1073741824], not -1"},
      {"server = { max_preauth_connections = 0; };", 1,
       "server.max_preauth_connections: must be an integer in [1, 65536], not 0"},
      {"server = { handshake_timeout_s = 0.01; };", 1,
       "server.handshake_timeout_s: must be a number in [0.05, 600]"},
      {"server = { max_handshake_bytes = 2047; };", 1,
       "server.max_handshake_bytes: must be an integer in [2048, 1048576], not 2047"},
      {"server = { frame_grace_s = 0; };", 1, "server.frame_grace_s: must be a number in [0.05, 86400]"},
      {"server = { min_recv_bytes_per_s = -1; };", 1,
       "server.min_recv_bytes_per_s: must be an integer in [0, 1073741824], not -1"},
      {"job = { connect_timeout_s = 0.05; };", 1,
       "job.connect_timeout_s: must be a number in [0.1, 86400], not 0.05"},
      {"job = { connect_timeout_s = 86401; };", 1,
       "job.connect_timeout_s: must be a number in [0.1, 86400]"},
      {"http = { max_connections = 3; };", 1,
       "http.max_connections: must be an integer in [4, 4096], not 3"},
      {"http = { max_connections_per_ip = 0; };", 1,
       "http.max_connections_per_ip: must be an integer in [1, 4096], not 0"},
      {"http = { request_timeout_s = 0.05; };", 1,
       "http.request_timeout_s: must be a number in [0.1, 3600]"},
      {"checkpoint = { restore_from = [\"/a\", \"\"]; };", 1,
       "checkpoint.restore_from[1]: a directory of 0 bytes: 1 to 512 are allowed"},
  };
  expect_all(cases, sizeof cases / sizeof cases[0]);

  /* 65 layers; a 4096-byte path. */
  char text[8192];
  size_t used = (size_t)snprintf(text, sizeof text, "model = { layers = [1");
  for (int i = 1; i < TS_CONFIG_MAX_LAYERS + 1; i++)
    used += (size_t)snprintf(text + used, sizeof text - used, ", 1");
  snprintf(text + used, sizeof text - used, "]; };");
  expect_error(text, 1, NULL, NULL, 0, "model.layers: must have 2 to 64 entries, not 65");
  used = (size_t)snprintf(text, sizeof text, "train = { logdir = \"");
  memset(text + used, 'a', 4096);
  snprintf(text + used + 4096, sizeof text - used - 4096, "\"; };");
  expect_error(text, 1, NULL, NULL, 0, "train.logdir: must be at most 4095 bytes long, not 4096");

  /* The edges themselves are allowed. */
  ts_config_t c;
  expect_ok(&c,
            "train = { batch_size = 65536; }; job = { partition_bytes = 4; staleness = 0; };\n"
            "optimizer = { momentum = 0.0; epsilon = 1; learning_rate = 1000; };\n"
            "device = { memory_fraction = 1.0; }; model = { layers = [1, 1048576]; };\n",
            NULL, NULL, 0);
  assert_int_equal(c.batch_size, 65536);
  assert_int_equal(c.partition_bytes, 4);
  assert_int_equal(c.layers[1], 1048576);
  ts_config_free(&c);
}

static void test_enums(void **state) {
  (void)state;
  static const struct {
    const char *text;
    ts_mode_t mode;
    ts_optimizer_t opt;
    ts_activation_t act;
  } ok[] = {
      {"job = { mode = \"sync\"; }; optimizer = { name = \"sgd\"; };", TS_MODE_SYNC, TS_OPT_SGD,
       TS_ACT_RELU},
      {"job = { mode = \"async\"; }; optimizer = { name = \"momentum\"; };"
       "model = { activation = \"tanh\"; };",
       TS_MODE_ASYNC, TS_OPT_MOMENTUM, TS_ACT_TANH},
      {"job = { mode = \"ssp\"; }; optimizer = { name = \"adam\"; };"
       "model = { activation = \"relu\"; };",
       TS_MODE_SSP, TS_OPT_ADAM, TS_ACT_RELU},
  };
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    ts_config_t c;
    expect_ok(&c, ok[i].text, NULL, NULL, 0);
    assert_int_equal(c.mode, ok[i].mode);
    assert_int_equal(c.optimizer, ok[i].opt);
    assert_int_equal(c.activation, ok[i].act);
    ts_config_free(&c);
  }
  static const struct bad bad[] = {
      {"job = { mode = \"fast\"; };", 1,
       "job.mode: must be one of \"sync\", \"async\", \"ssp\", not \"fast\""},
      {"job = { mode = \"SYNC\"; };", 1, "not \"SYNC\""},
      {"optimizer = { name = \"rmsprop\"; };", 1,
       "optimizer.name: must be one of \"sgd\", \"momentum\", \"adam\", not \"rmsprop\""},
      {"model = { activation = \"sigmoid\"; };", 1,
       "model.activation: must be one of \"relu\", \"tanh\", not \"sigmoid\""},
      {"data = { format = \"csv\"; };", 1, "data.format: must be one of \"idx\", \"criteo\", not \"csv\""},
  };
  expect_all(bad, sizeof bad / sizeof bad[0]);
  assert_string_equal(ts_mode_name(TS_MODE_SYNC), "sync");
  assert_string_equal(ts_mode_name(TS_MODE_ASYNC), "async");
  assert_string_equal(ts_mode_name(TS_MODE_SSP), "ssp");
  assert_string_equal(ts_mode_name((ts_mode_t)0), "unknown");
  assert_string_equal(ts_optimizer_name(TS_OPT_SGD), "sgd");
  assert_string_equal(ts_optimizer_name(TS_OPT_MOMENTUM), "momentum");
  assert_string_equal(ts_optimizer_name(TS_OPT_ADAM), "adam");
  assert_string_equal(ts_optimizer_name((ts_optimizer_t)99), "unknown");
}

static void test_unknown_keys(void **state) {
  (void)state;
  expect_error(
      "# a job\n"
      "cluster = { ps = [\"127.0.0.1:7100\"]; };\n"
      "\n"
      "job = {\n"
      "  mode = \"sync\";\n"
      "  staleness = 2;\n"
      "  moed = \"async\";\n"
      "};\n",
      7, NULL, NULL, 0, "job.moed: unknown key (did you mean job.mode?)");
  expect_error("\njbo = { mode = \"sync\"; };", 2, NULL, NULL, 0,
               "jbo: unknown key (did you mean job?)");
  expect_error("train = { batchsize = 3; };", 1, NULL, NULL, 0,
               "train.batchsize: unknown key (did you mean train.batch_size?)");
  expect_error("job = { batch_size = 3; };", 1, NULL, NULL, 0,
               "job.batch_size: unknown key (did you mean train.batch_size?)");
  expect_error("frobnicate = 1;", 1, NULL, NULL, 0, "frobnicate: unknown key (see docs/");
  expect_error("optimizer = { lr = 0.1; };", 1, NULL, NULL, 0,
               "optimizer.lr: unknown key (see docs/configuration.md)");
  expect_error("cluster = { worker = [\"127.0.0.1:9200\"]; };", 1, NULL, NULL, 0,
               "cluster.worker: unknown key (did you mean cluster.workers?)");
  expect_error("bogus = {};", 1, NULL, NULL, 0, "bogus: unknown key");
  expect_error("job = { mode = \"sync\"; extra = { a = 1; }; };", 1, NULL, NULL, 0,
               "job.extra: unknown key");
}

static void test_reference(void **state) {
  (void)state;
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  assert_non_null(f);
  ts_config_write_reference(f);
  fclose(f);
  static const char *const keys[] = {
      "cluster.ps",
      "cluster.ps_http",
      "cluster.workers",
      "job.mode",
      "job.replicas_to_aggregate",
      "job.min_workers",
      "job.name",
      "job.staleness",
      "job.sync_timeout_s",
      "job.heartbeat_timeout_s",
      "job.heartbeat_interval_s",
      "job.connect_timeout_s",
      "job.partition_bytes",
      "server.max_message_bytes",
      "server.max_connections",
      "server.push_min_bytes_per_s",
      "server.push_rate_window_s",
      "server.push_contended_min_bytes_per_s",
      "server.pull_hold_timeout_s",
      "server.max_reply_bytes_per_connection",
      "server.max_reply_bytes",
      "server.max_status_reply_bytes",
      "server.reply_full_timeout_s",
      "server.max_parked_pulls",
      "server.push_dedup_clients",
      "server.max_pull_wait_s",
      "server.max_preauth_connections",
      "server.handshake_timeout_s",
      "server.max_handshake_bytes",
      "server.frame_grace_s",
      "server.min_recv_bytes_per_s",
      "http.max_connections",
      "http.max_connections_per_ip",
      "http.request_timeout_s",
      "optimizer.name",
      "optimizer.learning_rate",
      "optimizer.momentum",
      "optimizer.beta1",
      "optimizer.beta2",
      "optimizer.epsilon",
      "optimizer.decay",
      "optimizer.decay_steps",
      "optimizer.decay_rate",
      "optimizer.staircase",
      "optimizer.decay_alpha",
      "model.layers",
      "model.activation",
      "model.seed",
      "data.format",
      "data.train_images",
      "data.train_labels",
      "data.test_images",
      "data.test_labels",
      "train.batch_size",
      "train.epochs",
      "train.max_steps",
      "train.logdir",
      "train.log_interval_s",
      "train.stall_timeout_s",
      "device.placement",
      "device.rules",
      "device.allow_soft_placement",
      "device.log_device_placement",
      "device.allow_growth",
      "device.memory_fraction",
      "device.intra_op_parallelism_threads",
      "checkpoint.dir",
      "checkpoint.interval_s",
      "checkpoint.keep",
      "auth.token_file",
      "auth.admin_token_file",
  };
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    char row[96];
    snprintf(row, sizeof row, "| `%s` |", keys[i]);
    assert_contains(buf, row);
  }
  assert_contains(buf, "| `job.mode` | string | `\"sync\"` | `\"sync\"`, `\"async\"`, `\"ssp\"` |");
  assert_contains(buf, "[4, 1073741824], a multiple of 4");
  free(buf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),     cmocka_unit_test(test_type_errors),
      cmocka_unit_test(test_bounds),       cmocka_unit_test(test_enums),
      cmocka_unit_test(test_unknown_keys), cmocka_unit_test(test_reference),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
