/* Unit tests of config/ts_config's loading: the demo and a full job file, wide integers,
 * file errors, --set overrides, TF_CONFIG, their precedence, cross-key rules, addresses,
 * and allocation failure. The key table itself (defaults, types, bounds, allowed values,
 * unknown keys, the reference) is in test_config_bounds.c. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_fixtures.h"

static void test_demo_file(void **state) {
  (void)state;
  ts_config_t cfg;
  const char *path = TS_SOURCE_ROOT "/deploy/local/cluster.cfg";
  int rc = ts_config_load(&cfg, path, NULL, NULL, 0, errmsg, sizeof errmsg);
  if (rc != 0) fail_msg("%s: %s", path, errmsg);
  assert_int_equal(cfg.num_ps, 2);
  assert_string_equal(cfg.ps[1], "127.0.0.1:7101");
  assert_int_equal(cfg.num_ps_http, 2);
  assert_string_equal(cfg.ps_http[0], "127.0.0.1:9100");
  assert_int_equal(cfg.num_workers, 2);
  assert_string_equal(cfg.workers[1], "127.0.0.1:9201");
  assert_int_equal(cfg.mode, TS_MODE_SYNC);
  assert_int_equal(cfg.num_layers, 3);
  assert_int_equal(cfg.activation, TS_ACT_RELU);
  assert_int_equal(cfg.batch_size, 64);
  assert_string_equal(cfg.placement, "/cpu:0");
  assert_string_equal(cfg.train_images, FMNIST "train-images-idx3-ubyte.gz");
  assert_string_equal(cfg.source, path);
  ts_config_free(&cfg);
}

static const char full_file[] =
    "# every key, none at its default\n"
    "cluster = { ps = [\"10.0.0.1:7000\", \"10.0.0.2:7000\", \"[::1]:7002\"];\n"
    "            ps_http = [\"10.0.0.1:8000\", \"10.0.0.2:8000\", \"[::1]:8002\"];\n"
    "            workers = (\"w0:9000\", \"w1:9000\", \"w2:9000\", \"w3:9000\"); };\n"
    "job = { mode = \"ssp\"; replicas_to_aggregate = 3; staleness = 7;\n"
    "        sync_timeout_s = 3; heartbeat_timeout_s = 2.5; heartbeat_interval_s = 0.5;\n"
    "        partition_bytes = 1048576; };\n"
    "server = { max_message_bytes = 4294967296; max_connections = 77; };\n"
    "optimizer = { name = \"adam\"; learning_rate = 0.001; momentum = 0.5;\n"
    "              beta1 = 0.8; beta2 = 0.99; epsilon = 1e-7; };\n"
    "model = { layers = (784, 300, 100, 10); activation = \"tanh\"; seed = 5000000000; };\n"
    "data = { format = \"idx\"; train_images = \"/d/a\"; train_labels = \"/d/b\";\n"
    "         test_images = \"/d/c\"; test_labels = \"/d/d\"; };\n"
    "train = { batch_size = 128; epochs = 3; max_steps = 10000000000L; logdir = \"/tmp/tb\";\n"
    "          log_interval_s = 1; };\n"
    "device = { placement = \"/gpu:1\"; allow_soft_placement = false;\n"
    "           log_device_placement = true; allow_growth = false; memory_fraction = 0.5; };\n"
    "checkpoint = { dir = \"/tmp/ckpt\"; interval_s = 30.5; keep = 9;\n"
    "               restore_from = [\"/var/lib/tessera/ps-0\", \"/var/lib/tessera/ps-1\"]; };\n"
    "auth = { token_file = \"/etc/t\"; admin_token_file = \"/etc/a\"; };\n";

static void test_full_file(void **state) {
  (void)state;
  ts_config_t c;
  expect_ok(&c, full_file, NULL, NULL, 0);
  assert_int_equal(c.num_ps, 3);
  assert_string_equal(c.ps[2], "[::1]:7002");
  assert_int_equal(c.num_ps_http, 3);
  assert_int_equal(c.num_workers, 4);
  assert_string_equal(c.workers[3], "w3:9000");
  assert_int_equal(c.mode, TS_MODE_SSP);
  assert_int_equal(c.replicas_to_aggregate, 3);
  assert_int_equal(c.staleness, 7);
  assert_true(c.sync_timeout_s == 3.0);
  assert_true(c.heartbeat_timeout_s == 2.5);
  assert_true(c.heartbeat_interval_s == 0.5);
  assert_int_equal(c.partition_bytes, 1048576);
  assert_int_equal(c.max_message_bytes, 4294967296LL); /* beyond 32 bits, no L */
  assert_int_equal(c.max_connections, 77);
  assert_int_equal(c.optimizer, TS_OPT_ADAM);
  assert_true(c.learning_rate == 0.001);
  assert_true(c.momentum == 0.5);
  assert_true(c.beta1 == 0.8);
  assert_true(c.beta2 == 0.99);
  assert_true(c.epsilon == 1e-7);
  assert_int_equal(c.num_layers, 4);
  assert_int_equal(c.layers[1], 300);
  assert_int_equal(c.layers[3], 10);
  assert_int_equal(c.activation, TS_ACT_TANH);
  assert_int_equal(c.seed, 5000000000LL);
  assert_string_equal(c.train_images, "/d/a");
  assert_string_equal(c.train_labels, "/d/b");
  assert_string_equal(c.test_images, "/d/c");
  assert_string_equal(c.test_labels, "/d/d");
  assert_int_equal(c.batch_size, 128);
  assert_int_equal(c.epochs, 3);
  assert_int_equal(c.max_steps, 10000000000LL);
  assert_string_equal(c.logdir, "/tmp/tb");
  assert_true(c.log_interval_s == 1.0);
  assert_string_equal(c.placement, "/gpu:1");
  assert_false(c.allow_soft_placement);
  assert_true(c.log_device_placement);
  assert_false(c.allow_growth);
  assert_true(c.memory_fraction == 0.5);
  assert_string_equal(c.checkpoint_dir, "/tmp/ckpt");
  assert_true(c.checkpoint_interval_s == 30.5);
  assert_int_equal(c.checkpoint_keep, 9);
  assert_int_equal(c.num_checkpoint_restore_from, 2);
  assert_string_equal(c.checkpoint_restore_from[1], "/var/lib/tessera/ps-1");
  assert_string_equal(c.token_file, "/etc/t");
  assert_string_equal(c.admin_token_file, "/etc/a");
  assert_string_equal(c.source, tmp_path);
  ts_config_free(&c);
}

/* Big numbers in strings and comments are left alone; hex beyond 32 bits is widened too. */
static void test_wide_integers(void **state) {
  (void)state;
  ts_config_t c;
  expect_ok(&c,
            "train = { logdir = \"/tmp/99999999999999999999\"; }; # 99999999999999999999\n"
            "/* 88888888888888888888 */ model = { seed = 0x100000000; };\n"
            "server = { max_message_bytes = 2147483647; };\n",
            NULL, NULL, 0);
  assert_string_equal(c.logdir, "/tmp/99999999999999999999");
  assert_int_equal(c.seed, 4294967296LL);
  assert_int_equal(c.max_message_bytes, 2147483647);
  ts_config_free(&c);
  expect_error("\n\nmodel = { seed = 99999999999999999999; };\n", 3, NULL, NULL, 0,
               "integer out of the 64-bit range");
  const char *ov[] = {"model.seed=9223372036854775807"};
  expect_ok(&c, NULL, NULL, ov, 1);
  assert_int_equal(c.seed, INT64_MAX);
  ts_config_free(&c);
}

static void test_file_errors(void **state) {
  (void)state;
  expect_error("job = {\n  mode = \"sync\";\n  staleness = ;\n};\n", 3, NULL, NULL, 0,
               "syntax error");
  expect_error("job = { mode = \"sync\"; mode = \"async\"; };", 1, NULL, NULL, 0,
               "duplicate setting name");

  ts_config_t c;
  int rc = ts_config_load(&c, "/nonexistent/job.cfg", NULL, NULL, 0, errmsg, sizeof errmsg);
  assert_int_equal(rc, TS_ECONFIG);
  assert_string_equal(errmsg, "/nonexistent/job.cfg: No such file or directory");
  ts_config_free(&c);

  rc = ts_config_load(&c, "/tmp", NULL, NULL, 0, errmsg, sizeof errmsg);
  assert_int_equal(rc, TS_ECONFIG);
  assert_string_equal(errmsg, "/tmp: Is a directory");
  ts_config_free(&c);

  if (geteuid() != 0) { /* root reads anything */
    write_tmp("job = {};\n");
    chmod(tmp_path, 0);
    rc = ts_config_load(&c, tmp_path, NULL, NULL, 0, errmsg, sizeof errmsg);
    unlink(tmp_path);
    assert_int_equal(rc, TS_ECONFIG);
    assert_contains(errmsg, "Permission denied");
    ts_config_free(&c);
  }

  /* An empty file is a job of defaults. */
  expect_ok(&c, "", NULL, NULL, 0);
  check_defaults(&c);
  ts_config_free(&c);
  /* A NULL errmsg is allowed. */
  assert_int_equal(ts_config_load(&c, "/nonexistent", NULL, NULL, 0, NULL, 0), TS_ECONFIG);
  ts_config_free(&c);
}

static void test_overrides(void **state) {
  (void)state;
  const char *ov[] = {
      "device.allow_growth=false",
      "train.max_steps=200",
      "train.batch_size = 32",
      "server.max_message_bytes=4294967296",
      "model.seed=7",
      "optimizer.learning_rate=0.5",
      "job.sync_timeout_s=3",
      "train.logdir=\"/tmp/tb\"",
      "checkpoint.dir=/tmp/ckpt dir",
      "auth.token_file=",
      "job.mode=\"async\"",
      "model.activation=tanh",
      "cluster.ps=[\"127.0.0.1:1\",\"127.0.0.1:2\"]",
      "cluster.workers=(\"127.0.0.1:3\")",
      "model.layers=[784,10]",
      "job.mode=ssp", /* a later override wins */
  };
  ts_config_t c;
  expect_ok(&c, NULL, NULL, ov, sizeof ov / sizeof ov[0]);
  assert_false(c.allow_growth);
  assert_int_equal(c.max_steps, 200);
  assert_int_equal(c.batch_size, 32);
  assert_int_equal(c.max_message_bytes, 4294967296LL);
  assert_int_equal(c.seed, 7);
  assert_true(c.learning_rate == 0.5);
  assert_true(c.sync_timeout_s == 3.0);
  assert_string_equal(c.logdir, "/tmp/tb");
  assert_string_equal(c.checkpoint_dir, "/tmp/ckpt dir");
  assert_string_equal(c.token_file, "");
  assert_int_equal(c.mode, TS_MODE_SSP);
  assert_int_equal(c.activation, TS_ACT_TANH);
  assert_int_equal(c.num_ps, 2);
  assert_string_equal(c.ps[1], "127.0.0.1:2");
  assert_int_equal(c.num_workers, 1);
  assert_string_equal(c.workers[0], "127.0.0.1:3");
  assert_int_equal(c.num_layers, 2);
  assert_int_equal(c.layers[1], 10);
  ts_config_free(&c);
}

static void test_override_errors(void **state) {
  (void)state;
  static const struct {
    const char *ov, *needle;
  } cases[] = {
      {"job.mode", "--set job.mode: expected KEY=VALUE"},
      {"=5", "--set =5: expected KEY=VALUE"},
      {"job.moed=1", "--set job.moed=1: job.moed: unknown key (did you mean job.mode?)"},
      {"job.mode=fast",
       "--set job.mode=fast: job.mode: must be one of \"sync\", \"async\", \"ssp\", not \"fast\""},
      {"job.mode=\"fast", "--set job.mode=\"fast: job.mode: cannot parse the value"},
      {"train.max_steps=abc", "--set train.max_steps=abc: train.max_steps: cannot parse the value"},
      {"train.max_steps=", "train.max_steps: cannot parse the value"},
      {"train.max_steps=1; x = 2", "train.max_steps: the value must be one setting's value"},
      {"train.max_steps=\"5\"", "train.max_steps: must be an integer, not a string (\"5\")"},
      {"train.batch_size=0", "--set train.batch_size=0: train.batch_size: must be an integer in"},
      {"model.layers=[784]", "model.layers: must have 2 to 64 entries, not 1"},
      {"model.layers=784", "model.layers: must be an array of integers or a list of layers, not an integer"},
      {"cluster.ps=[\"nope\"]", "cluster.ps[0]: \"nope\" is not host:port"},
      {"device.allow_growth=yes", "device.allow_growth: cannot parse the value"},
      {"job={mode=\"async\";}", "--set job={mode=\"async\";}: job: is a section"},
      {"model.seed=99999999999999999999", "model.seed: cannot parse the value (integer out of"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *ov[] = {"train.max_steps=5", cases[i].ov};
    expect_error(NULL, 0, NULL, ov, 2, cases[i].needle);
  }
}

static void test_precedence(void **state) {
  (void)state;
  const char *file =
      "cluster = { ps = [\"127.0.0.1:7100\", \"127.0.0.1:7101\"]; };\n"
      "train = { max_steps = 10; }; job = { mode = \"async\"; };\n";
  const char *tf =
      "{\"cluster\":{\"ps\":[\"ps0:2222\",\"ps1:2222\",\"ps2:2222\"],\"worker\":[\"w0:2222\"]},"
      "\"task\":{\"type\":\"ps\",\"index\":2}}";
  ts_config_t c;
  /* TF_CONFIG over the file. */
  expect_ok(&c, file, tf, NULL, 0);
  assert_int_equal(c.num_ps, 3);
  assert_string_equal(c.ps[0], "ps0:2222");
  assert_int_equal(c.max_steps, 10);
  assert_int_equal(c.mode, TS_MODE_ASYNC);
  ts_config_free(&c);
  /* Overrides over both. */
  const char *ov[] = {"cluster.ps=[\"a:1\", \"b:1\", \"c:1\", \"d:1\"]", "train.max_steps=20",
                      "job.mode=sync"};
  expect_ok(&c, file, tf, ov, 3);
  assert_int_equal(c.num_ps, 4);
  assert_string_equal(c.ps[3], "d:1");
  assert_int_equal(c.num_workers, 1);
  assert_string_equal(c.workers[0], "w0:2222");
  assert_int_equal(c.max_steps, 20);
  assert_int_equal(c.mode, TS_MODE_SYNC);
  assert_int_equal(c.task_role, TS_ROLE_PS);
  assert_int_equal(c.task_index, 2);
  ts_config_free(&c);
}

static void test_tf_config(void **state) {
  (void)state;
  ts_config_t c;
  expect_ok(&c, NULL,
            "{\"cluster\":{\"ps\":[\"h1:1\",\"h2:2\"],\"worker\":[\"w1:1\",\"w2:2\",\"w3:3\"]},"
            "\"task\":{\"type\":\"worker\",\"index\":2},\"environment\":\"cloud\"}",
            NULL, 0);
  assert_int_equal(c.num_ps, 2);
  assert_string_equal(c.ps[1], "h2:2");
  assert_int_equal(c.num_workers, 3);
  assert_string_equal(c.workers[2], "w3:3");
  assert_int_equal(c.task_role, TS_ROLE_WORKER);
  assert_int_equal(c.task_index, 2);
  ts_config_free(&c);

  /* Empty (TF_CONFIG= in a shell) is as good as unset; a task alone keeps the cluster. */
  expect_ok(&c, NULL, "  ", NULL, 0);
  check_defaults(&c);
  ts_config_free(&c);
  expect_ok(&c, NULL, "{\"task\":{\"type\":\"ps\",\"index\":0}}", NULL, 0);
  assert_int_equal(c.task_role, TS_ROLE_PS);
  assert_int_equal(c.task_index, 0);
  assert_int_equal(c.num_ps, 1);
  ts_config_free(&c);
}

static void test_tf_config_errors(void **state) {
  (void)state;
  static const struct {
    const char *tf, *needle;
  } cases[] = {
      {"{", "TF_CONFIG: not valid JSON"},
      {"{} trailing", "TF_CONFIG: not valid JSON"},
      {"[]", "TF_CONFIG: must be a JSON object"},
      {"{\"cluster\":[]}", "TF_CONFIG: cluster: must be an object"},
      {"{\"cluster\":{\"ps\":\"h:1\"}}", "TF_CONFIG: cluster.ps: must be an array"},
      {"{\"cluster\":{\"ps\":[1]}}",
       "TF_CONFIG: cluster.ps: entry 0 must be a \"host:port\" string"},
      {"{\"cluster\":{\"worker\":{}}}", "TF_CONFIG: cluster.worker: must be an array"},
      {"{\"cluster\":{\"ps\":[\"bad\"]}}", "TF_CONFIG: cluster.ps[0]: \"bad\" is not host:port"},
      {"{\"cluster\":{\"worker\":[]}}",
       "TF_CONFIG: cluster.workers: must have 1 to 256 entries, not 0"},
      {"{\"cluster\":{\"chief\":[\"h:1\"]}}", "TF_CONFIG: cluster.chief: Tessera runs only"},
      {"{\"task\":[]}", "TF_CONFIG: task: must be an object"},
      {"{\"task\":{\"type\":\"chief\",\"index\":0}}",
       "TF_CONFIG: task.type: must be \"ps\" or \"worker\", not \"chief\""},
      {"{\"task\":{\"index\":0}}", "TF_CONFIG: task.type: must be \"ps\" or \"worker\""},
      {"{\"task\":{\"type\":\"ps\"}}", "TF_CONFIG: task.index: must be an integer"},
      {"{\"task\":{\"type\":\"ps\",\"index\":-1}}", "TF_CONFIG: task.index: must be an integer"},
      {"{\"task\":{\"type\":\"ps\",\"index\":1.5}}", "TF_CONFIG: task.index: must be an integer"},
      {"{\"task\":{\"type\":\"ps\",\"index\":\"0\"}}", "TF_CONFIG: task.index: must be an integer"},
      {"{\"task\":{\"type\":\"ps\",\"index\":1}}",
       "TF_CONFIG: task.index: 1 is out of range: cluster.ps has 1 entries"},
      {"{\"task\":{\"type\":\"worker\",\"index\":3}}",
       "TF_CONFIG: task.index: 3 is out of range: cluster.workers has 1 entries"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    expect_error(NULL, 0, cases[i].tf, NULL, 0, cases[i].needle);
}

static void test_cross_key(void **state) {
  (void)state;
  expect_error(
      "cluster = { ps = [\"127.0.0.1:7100\", \"127.0.0.1:7101\"];\n"
      "            ps_http = [\"127.0.0.1:9100\"]; };\n",
      2, NULL, NULL, 0, "cluster.ps_http: has 1 entries but cluster.ps has 2; give one per shard");
  expect_error(
      "cluster = { workers = [\"127.0.0.1:9200\", \"127.0.0.1:9201\"]; };\n"
      "job = { replicas_to_aggregate = 3; };\n",
      2, NULL, NULL, 0,
      "job.replicas_to_aggregate: 3 is more than the 2 workers of cluster.workers");
  expect_error(
      "cluster = { workers = [\"127.0.0.1:9200\", \"127.0.0.1:9201\"]; };\n"
      "job = { min_workers = 3; };\n",
      2, NULL, NULL, 0, "job.min_workers: 3 is more than the 2 workers of cluster.workers");
  /* The message names where the offending value came from. */
  const char *ov[] = {"job.replicas_to_aggregate=2"};
  expect_error(NULL, 0, "{\"cluster\":{\"worker\":[\"w:1\"]}}", ov, 1,
               "--set job.replicas_to_aggregate=2: job.replicas_to_aggregate: 2 is more than");
  expect_error("job = { heartbeat_interval_s = 5.0; };", 1, NULL, NULL, 0,
               "job.heartbeat_interval_s: 5 must be less than job.heartbeat_timeout_s (5)");
  expect_error("\nserver = { max_message_bytes = 1048576; };", 2, NULL, NULL, 0,
               "job.partition_bytes: 4194304 exceeds server.max_message_bytes (1048576)");
  expect_error("cluster = { ps = [\"127.0.0.1:7100\", \"127.0.0.1:7100\"]; };", 1, NULL, NULL, 0,
               "cluster.ps[1]: address 127.0.0.1:7100 is also cluster.ps[0]");
  expect_error("cluster = { workers = [\"127.0.0.1:7100\"]; };", 1, NULL, NULL, 0,
               "cluster.workers[0]: address 127.0.0.1:7100 is also cluster.ps[0]");
  /* TF_CONFIG's task checked against the cluster an override leaves. */
  const char *shrink[] = {"cluster.ps=[\"a:1\"]"};
  expect_error(NULL, 0,
               "{\"cluster\":{\"ps\":[\"a:1\",\"b:1\"]},\"task\":{\"type\":\"ps\",\"index\":1}}",
               shrink, 1, "TF_CONFIG: task.index: 1 is out of range: cluster.ps has 1 entries");
  /* replicas_to_aggregate equal to the workers is fine. */
  ts_config_t c;
  const char *eq[] = {"job.replicas_to_aggregate=1"};
  expect_ok(&c, NULL, NULL, eq, 1);
  ts_config_free(&c);
}

static void test_split_address(void **state) {
  (void)state;
  char host[64];
  int port = -1;
  assert_int_equal(ts_addr_split("127.0.0.1:7100", host, sizeof host, &port), 0);
  assert_string_equal(host, "127.0.0.1");
  assert_int_equal(port, 7100);
  assert_int_equal(ts_addr_split("localhost:1", host, sizeof host, &port), 0);
  assert_string_equal(host, "localhost");
  assert_int_equal(port, 1);
  assert_int_equal(ts_addr_split("ps-0.ps.svc_x:65535", host, sizeof host, &port), 0);
  assert_int_equal(port, 65535);
  assert_int_equal(ts_addr_split("[::1]:7100", host, sizeof host, &port), 0);
  assert_string_equal(host, "::1");
  assert_int_equal(port, 7100);
  assert_int_equal(ts_addr_split("[fe80::1%eth0]:80", host, sizeof host, &port), 0);
  assert_string_equal(host, "fe80::1%eth0");
  assert_int_equal(ts_addr_split("h:80", NULL, 0, NULL), 0); /* validate only */

  static const char *const bad[] = {
      "",      "host",      "host:",          ":80",     "h:0",     "h:65536",  "h:-1",  "h:+80",
      "h:80x", "h:123456",  "h: 80",          "a b:80",  "h/x:80",  "::1:7100", "[::1]", "[::1]:",
      "[]:80", "[::1]x:80", "[127.0.0.1]:80", "[::1:80", "h:99999",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    if (ts_addr_split(bad[i], host, sizeof host, &port) != TS_EINVAL)
      fail_msg("\"%s\" was accepted", bad[i]);
  assert_int_equal(ts_addr_split(NULL, host, sizeof host, &port), TS_EINVAL);
  /* The host must fit, terminator included. */
  assert_int_equal(ts_addr_split("abcd:1", host, 4, &port), TS_EINVAL);
  assert_int_equal(ts_addr_split("abc:1", host, 4, &port), 0);
  assert_string_equal(host, "abc");
}

/* Makes the n-th allocation fail for n = 1, 2, ... until loading succeeds: every failure must
 * be TS_ENOMEM with a message, and (under ASan) nothing may leak. */
static void test_alloc_failure(void **state) {
  (void)state;
  const char *tf =
      "{\"cluster\":{\"ps\":[\"h1:1\",\"h2:2\"],\"worker\":[\"w1:1\",\"w2:2\"]},"
      "\"task\":{\"type\":\"worker\",\"index\":1}}";
  const char *ov[] = {"cluster.ps_http=[\"h1:8\",\"h2:8\"]", "train.logdir=/tmp/x",
                      "model.layers=[784, 32, 10]",          "job.mode=\"async\"",
                      "train.max_steps=4294967296",          "job.replicas_to_aggregate=2"};
  const char *path = write_tmp(full_file);
  char file_path[64];
  snprintf(file_path, sizeof file_path, "%s", path);
  long n;
  for (n = 1; n < 100000; n++) {
    ts_config_t c;
    ts_alloc_fail_after(n);
    errmsg[0] = '\0';
    int rc = ts_config_load(&c, file_path, tf, ov, sizeof ov / sizeof ov[0], errmsg, sizeof errmsg);
    ts_alloc_fail_after(0);
    if (rc == 0) {
      assert_int_equal(c.num_ps, 2);
      assert_int_equal(c.num_ps_http, 2);
      assert_string_equal(c.logdir, "/tmp/x");
      ts_config_free(&c);
      break;
    }
    if (rc != TS_ENOMEM) fail_msg("n=%ld: got %s: %s", n, ts_err_name(rc), errmsg);
    assert_contains(errmsg, "out of memory");
    assert_null(c.source); /* everything already freed */
    assert_null(c.ps);
    ts_config_free(&c);
  }
  unlink(file_path);
  assert_true(n > 50); /* the loop reached the interesting allocations */

  for (n = 1; n < 10000; n++) {
    ts_config_t c;
    ts_alloc_fail_after(n);
    int rc = ts_config_defaults(&c);
    ts_alloc_fail_after(0);
    if (rc == 0) {
      check_defaults(&c);
      ts_config_free(&c);
      break;
    }
    assert_int_equal(rc, TS_ENOMEM);
    ts_config_free(&c);
  }
  assert_true(n > 5);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_demo_file),        cmocka_unit_test(test_full_file),
      cmocka_unit_test(test_wide_integers),    cmocka_unit_test(test_file_errors),
      cmocka_unit_test(test_overrides),        cmocka_unit_test(test_override_errors),
      cmocka_unit_test(test_precedence),       cmocka_unit_test(test_tf_config),
      cmocka_unit_test(test_tf_config_errors), cmocka_unit_test(test_cross_key),
      cmocka_unit_test(test_split_address),    cmocka_unit_test(test_alloc_failure),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
