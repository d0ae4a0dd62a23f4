/* Helpers shared by the config unit tests (test_config.c, test_config_bounds.c): load a job
 * file from text, expect success or one error line, and the full set of default values.
 * Each test program includes this once; everything here is static. */
#ifndef TS_TEST_CONFIG_FIXTURES_H
#define TS_TEST_CONFIG_FIXTURES_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "ts_addr.h"
#include "ts_alloc.h"
#include "ts_config.h"
#include "ts_err.h"

static char errmsg[256];
static char tmp_path[64];

/* Writes text to a fresh file under /tmp; its path is left in tmp_path. */
static inline const char *write_tmp(const char *text) {
  snprintf(tmp_path, sizeof tmp_path, "/tmp/ts_config_test_XXXXXX");
  int fd = mkstemp(tmp_path);
  assert_true(fd >= 0);
  size_t len = strlen(text);
  assert_int_equal(write(fd, text, len), (ssize_t)len);
  close(fd);
  return tmp_path;
}

/* Loads text as a job file (NULL = no file) plus TF_CONFIG and overrides. */
static inline int load(ts_config_t *cfg, const char *text, const char *tf, const char *const *ov,
                       size_t n) {
  const char *path = text ? write_tmp(text) : NULL;
  errmsg[0] = '\0';
  int rc = ts_config_load(cfg, path, tf, ov, n, errmsg, sizeof errmsg);
  if (path) unlink(path);
  return rc;
}

static inline void assert_contains(const char *hay, const char *needle) {
  if (!strstr(hay, needle)) fail_msg("expected \"%s\" in \"%s\"", needle, hay);
}

/* Expects TS_ECONFIG and a one-line errmsg containing needle; line > 0 also wants the
 * message to start with "<file>:<line>: ". */
static inline void expect_error(const char *text, int line, const char *tf, const char *const *ov,
                                size_t n, const char *needle) {
  ts_config_t cfg;
  int rc = load(&cfg, text, tf, ov, n);
  if (rc != TS_ECONFIG)
    fail_msg("expected TS_ECONFIG (%d), got %d (%s); errmsg \"%s\"", TS_ECONFIG, rc,
             ts_err_name(rc), errmsg);
  assert_contains(errmsg, needle);
  assert_null(strchr(errmsg, '\n'));
  if (line > 0) {
    char prefix[96];
    snprintf(prefix, sizeof prefix, "%s:%d: ", tmp_path, line);
    if (strncmp(errmsg, prefix, strlen(prefix)) != 0)
      fail_msg("expected \"%s\" to start with \"%s\"", errmsg, prefix);
  }
  ts_config_free(&cfg);
}

static inline void expect_ok(ts_config_t *cfg, const char *text, const char *tf,
                             const char *const *ov, size_t n) {
  int rc = load(cfg, text, tf, ov, n);
  if (rc != 0) fail_msg("expected success, got %d (%s): %s", rc, ts_err_name(rc), errmsg);
}

#define FMNIST "/usr/share/datasets/fashion-mnist/"

static inline void check_defaults(const ts_config_t *c) {
  assert_int_equal(c->num_ps, 1);
  assert_string_equal(c->ps[0], "127.0.0.1:7100");
  assert_int_equal(c->num_ps_http, 0);
  assert_int_equal(c->num_workers, 1);
  assert_string_equal(c->workers[0], "127.0.0.1:9200");
  assert_int_equal(c->mode, TS_MODE_SYNC);
  assert_int_equal(c->replicas_to_aggregate, 0);
  assert_int_equal(c->min_workers, 0);
  assert_string_equal(c->job_name, "");
  assert_int_equal(c->staleness, 2);
  assert_true(c->sync_timeout_s == 10.0);
  assert_true(c->heartbeat_timeout_s == 5.0);
  assert_true(c->heartbeat_interval_s == 1.0);
  assert_true(c->connect_timeout_s == 120.0);
  assert_int_equal(c->partition_bytes, 4194304);
  assert_int_equal(c->max_message_bytes, 1073741824);
  assert_int_equal(c->max_connections, 1024);
  assert_int_equal(c->max_model_bytes, 17179869184LL);
  assert_int_equal(c->max_table_bytes, 4294967296LL);
  assert_int_equal(c->push_min_bytes_per_s, 65536);
  assert_true(c->push_rate_window_s == 5.0);
  assert_int_equal(c->push_contended_min_bytes_per_s, 1048576);
  assert_true(c->pull_hold_timeout_s == 10.0);
  assert_int_equal(c->max_reply_bytes_per_connection, 16777216);
  assert_int_equal(c->max_reply_bytes, 67108864);
  assert_int_equal(c->max_status_reply_bytes, 4194304);
  assert_true(c->reply_full_timeout_s == 10.0);
  assert_int_equal(c->max_parked_pulls, 64);
  assert_int_equal(c->push_dedup_clients, 4);
  assert_true(c->max_pull_wait_s == 300.0);
  assert_int_equal(c->max_preauth_connections, 128);
  assert_true(c->handshake_timeout_s == 5.0);
  assert_int_equal(c->max_handshake_bytes, 4096);
  assert_true(c->frame_grace_s == 10.0);
  assert_int_equal(c->min_recv_bytes_per_s, 4096);
  assert_int_equal(c->http_max_connections, 256);
  assert_int_equal(c->http_max_connections_per_ip, 32);
  assert_true(c->http_request_timeout_s == 5.0);
  assert_int_equal(c->optimizer, TS_OPT_SGD);
  assert_true(c->learning_rate == 0.1);
  assert_true(c->momentum == 0.9);
  assert_true(c->beta1 == 0.9);
  assert_true(c->beta2 == 0.999);
  assert_true(c->epsilon == 1e-8);
  assert_int_equal(c->decay, TS_DECAY_NONE);
  assert_int_equal(c->decay_steps, 1000);
  assert_true(c->decay_rate == 0.96);
  assert_false(c->staircase);
  assert_true(c->decay_alpha == 0.0);
  assert_int_equal(c->num_layers, 3);
  assert_int_equal(c->layers[0], 784);
  assert_int_equal(c->layers[1], 128);
  assert_int_equal(c->layers[2], 10);
  assert_int_equal(c->activation, TS_ACT_RELU);
  assert_int_equal(c->seed, 42);
  assert_string_equal(c->data_format, "idx");
  assert_string_equal(c->train_images, FMNIST "train-images-idx3-ubyte.gz");
  assert_string_equal(c->train_labels, FMNIST "train-labels-idx1-ubyte.gz");
  assert_string_equal(c->test_images, FMNIST "t10k-images-idx3-ubyte.gz");
  assert_string_equal(c->test_labels, FMNIST "t10k-labels-idx1-ubyte.gz");
  assert_int_equal(c->batch_size, 64);
  assert_int_equal(c->epochs, 1);
  assert_int_equal(c->max_steps, 0);
  assert_string_equal(c->logdir, "");
  assert_true(c->log_interval_s == 5.0);
  assert_true(c->stall_timeout_s == 0.0);
  assert_string_equal(c->placement, "");
  assert_int_equal(c->num_placement_rules, 0);
  assert_false(c->allow_soft_placement);
  assert_false(c->log_device_placement);
  assert_true(c->allow_growth);
  assert_true(c->memory_fraction == 0.0);
  assert_int_equal(c->intra_op_threads, 0);
  assert_string_equal(c->checkpoint_dir, "");
  assert_true(c->checkpoint_interval_s == 60.0);
  assert_int_equal(c->checkpoint_keep, 3);
  assert_int_equal(c->num_checkpoint_restore_from, 0);
  assert_string_equal(c->token_file, "");
  assert_string_equal(c->admin_token_file, "");
  assert_int_equal(c->task_role, TS_ROLE_NONE);
  assert_int_equal(c->task_index, -1);
}

#endif
