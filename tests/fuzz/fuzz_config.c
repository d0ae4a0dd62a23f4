/*
 * Fuzz target: the job configuration loader (ts_config_load). Input: sections separated by
 * 0xff bytes: the job file's text, then TF_CONFIG (absent = unset), then up to
 * MAX_OVERRIDES "--set KEY=VALUE" overrides (further sections are ignored). The job file is
 * written to a memfd, read back through /proc/self/fd/N. A loaded configuration must satisfy
 * the documented bounds and cross-key rules; a refused one must leave a message and a
 * zeroed *cfg.
 *
 * libconfig's @include reads whatever path it names (relative to the job file's folder,
 * here /proc/self/fd, or to the working directory for an override): inputs that mention
 * "@include" in any case are skipped, so the fuzzer never reads stdin or other files.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_target.h"
#include "ts_addr.h"
#include "ts_config.h"
#include "ts_err.h"

#define MAX_OVERRIDES 4
#define SEPARATOR 0xff

static void check(int ok, const char *what) { fuzz_check(ok, "fuzz_config", what); }

/* libconfig before 1.7.3 leaks a string token that a syntax error discards (hyperrealm/
 * libconfig issue #142, fixed by PR #155); Debian 12 ships 1.5. Only the scanner's token
 * strings are let off (a non-empty one is grown by strbuf_append, an empty one allocated in
 * the scanner itself): a setting tree we failed to config_destroy would still leak its
 * settings, which the parser allocates. LeakSanitizer calls this in the libFuzzer binary and
 * in a sanitizer build of the replay test. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) {
  return "leak:strbuf_append\nleak:libconfig_yylex\n";
}

static int job_fd = -1;
static char job_path[64];

/* True when data mentions "@include", in any case. */
static int mentions_include(const uint8_t *data, size_t size) {
  static const char word[] = "@include";
  const size_t n = sizeof word - 1;
  for (size_t i = 0; i + n <= size; i++) {
    size_t k = 0;
    while (k < n && tolower(data[i + k]) == word[k]) k++;
    if (k == n) return 1;
  }
  return 0;
}

static void write_job(const uint8_t *text, size_t len) {
  if (job_fd < 0) {
    job_fd = memfd_create("fuzz_config.cfg", MFD_CLOEXEC);
    check(job_fd >= 0, "memfd_create");
    snprintf(job_path, sizeof job_path, "/proc/self/fd/%d", job_fd);
  }
  check(ftruncate(job_fd, 0) == 0, "ftruncate");
  check(len == 0 || pwrite(job_fd, text, len, 0) == (ssize_t)len, "pwrite");
}

static void check_hosts(char **list, size_t n, size_t min) {
  check(n >= min && n <= TS_CONFIG_MAX_HOSTS, "host count within bounds");
  check(n == 0 || list != NULL, "host list present");
  for (size_t i = 0; i < n; i++) {
    char host[256];
    int port = 0;
    check(ts_addr_split(list[i], host, sizeof host, &port) == 0,
          "every address splits");
    check(port >= 1 && port <= 65535 && host[0] != '\0', "address has a host and a port");
  }
}

static int in_range(double v, double lo, double hi) { return isfinite(v) && v >= lo && v <= hi; }

static void check_loaded(const ts_config_t *c) {
  check_hosts(c->ps, c->num_ps, 1);
  check_hosts(c->ps_http, c->num_ps_http, 0);
  check_hosts(c->workers, c->num_workers, 1);
  check(c->num_ps_http == 0 || c->num_ps_http == c->num_ps, "ps_http: none or one per shard");
  char **lists[3] = {c->ps, c->ps_http, c->workers};
  size_t counts[3] = {c->num_ps, c->num_ps_http, c->num_workers};
  for (int a = 0; a < 3; a++)
    for (size_t i = 0; i < counts[a]; i++)
      for (int b = 0; b < 3; b++)
        for (size_t j = 0; j < counts[b]; j++)
          check((a == b && i == j) || strcmp(lists[a][i], lists[b][j]) != 0,
                "addresses are distinct");

  check(strcmp(ts_mode_name(c->mode), "unknown") != 0, "mode is known");
  check(strcmp(ts_optimizer_name(c->optimizer), "unknown") != 0, "optimizer is known");
  check(c->activation == TS_ACT_RELU || c->activation == TS_ACT_TANH, "activation is known");
  check(c->replicas_to_aggregate >= 0 && (size_t)c->replicas_to_aggregate <= c->num_workers,
        "replicas_to_aggregate within the workers");
  check(c->staleness >= 0 && c->staleness <= 65535, "staleness");
  check(in_range(c->sync_timeout_s, 0.01, 86400.0), "sync_timeout_s");
  check(in_range(c->heartbeat_interval_s, 0.01, 3600.0) &&
            in_range(c->heartbeat_timeout_s, 0.01, 3600.0) &&
            c->heartbeat_interval_s < c->heartbeat_timeout_s,
        "heartbeat interval below timeout");
  check(c->partition_bytes >= 4 && c->partition_bytes % 4 == 0 &&
            c->partition_bytes <= c->max_message_bytes,
        "partition_bytes");
  check(c->max_message_bytes >= (1 << 20) && c->max_message_bytes <= (16LL << 30),
        "max_message_bytes");
  check(c->max_connections >= 1 && c->max_connections <= 65536, "max_connections");
  check(c->max_preauth_connections >= 1 && c->max_preauth_connections <= 65536,
        "max_preauth_connections");
  check(in_range(c->handshake_timeout_s, 0.05, 600.0), "handshake_timeout_s");
  check(c->max_handshake_bytes >= 2048 && c->max_handshake_bytes <= (1 << 20),
        "max_handshake_bytes");
  check(in_range(c->frame_grace_s, 0.05, 86400.0), "frame_grace_s");
  check(c->min_recv_bytes_per_s >= 0 && c->min_recv_bytes_per_s <= (1LL << 30),
        "min_recv_bytes_per_s");
  check(c->http_max_connections >= 4 && c->http_max_connections <= 4096, "http_max_connections");
  check(c->http_max_connections_per_ip >= 1 && c->http_max_connections_per_ip <= 4096,
        "http_max_connections_per_ip");
  check(in_range(c->http_request_timeout_s, 0.1, 3600.0), "http_request_timeout_s");
  check(in_range(c->learning_rate, 0.0, 1000.0) && c->learning_rate > 0.0, "learning_rate");
  check(in_range(c->momentum, 0.0, 1.0) && c->momentum < 1.0, "momentum");
  check(in_range(c->beta1, 0.0, 1.0) && c->beta1 < 1.0, "beta1");
  check(in_range(c->beta2, 0.0, 1.0) && c->beta2 < 1.0, "beta2");
  check(in_range(c->epsilon, 0.0, 1.0) && c->epsilon > 0.0, "epsilon");
  check(c->num_layers >= 2 && c->num_layers <= TS_CONFIG_MAX_LAYERS, "layer count");
  for (size_t i = 0; i < c->num_layers; i++)
    check(c->layers[i] >= 1 && c->layers[i] <= (1 << 20), "layer width");
  check(c->seed >= 0 && c->max_steps >= 0, "seed and max_steps non-negative");
  check(c->data_format && strcmp(c->data_format, "idx") == 0, "data.format");
  check(c->train_images && c->train_labels && c->test_images && c->test_labels &&
            c->train_images[0] && c->train_labels[0] && c->test_images[0] && c->test_labels[0],
        "data paths set");
  check(c->batch_size >= 1 && c->batch_size <= 65536 && c->epochs >= 1, "batch_size, epochs");
  check(c->logdir && strlen(c->logdir) <= 4095, "train.logdir");
  check(in_range(c->log_interval_s, 0.1, 86400.0), "log_interval_s");
  check(c->placement && (c->placement[0] == '/' || c->placement[0] == '\0'), "device.placement");
  check(c->num_placement_rules <= 64, "device.rules count");
  for (size_t i = 0; i < c->num_placement_rules; i++)
    check(c->placement_rules[i] && strchr(c->placement_rules[i], '=') &&
              c->placement_rules[i][0] != '=' && strlen(c->placement_rules[i]) <= 255,
          "device.rules entry PATTERN=DEVICE");
  check(in_range(c->memory_fraction, 0.0, 1.0), "memory_fraction");
  check(c->checkpoint_dir && in_range(c->checkpoint_interval_s, 1.0, 604800.0) &&
            c->checkpoint_keep >= 1 && c->checkpoint_keep <= 1000,
        "checkpoint");
  check(c->token_file && c->admin_token_file, "auth files set");
  check(c->source && strcmp(c->source, job_path) == 0, "source names the file");
  if (c->task_role == TS_ROLE_NONE) {
    check(c->task_index == -1, "no task index without a role");
  } else {
    size_t n = c->task_role == TS_ROLE_PS ? c->num_ps : c->num_workers;
    check(c->task_role == TS_ROLE_PS || c->task_role == TS_ROLE_WORKER, "task role");
    check(c->task_index >= 0 && (size_t)c->task_index < n, "task index names a task");
  }
}

/* Loads once and checks the outcome's contract. */
static void load(const char *tf, const char *const *ov, size_t n, char *errmsg, size_t errlen) {
  ts_config_t cfg;
  memset(&cfg, 0xa5, sizeof cfg); /* an output: its old content is never read */
  memset(errmsg, 0x55, errlen);
  int rc = ts_config_load(&cfg, job_path, tf, ov, n, errmsg, errlen);
  if (rc == 0) {
    check_loaded(&cfg);
  } else {
    check(rc == TS_ECONFIG || rc == TS_ENOMEM, "config error code");
    check(memchr(errmsg, '\0', errlen) != NULL, "error message is terminated");
    check(errmsg[0] != '\0', "a refusal has a message");
    check(cfg.ps == NULL && cfg.num_ps == 0 && cfg.source == NULL && cfg.task_index == -1,
          "a refused configuration is freed");
  }
  ts_config_free(&cfg);
  ts_config_free(&cfg); /* twice is harmless */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (mentions_include(data, size)) return 0;
  /* Split on the separator into NUL-terminated sections of one copy. */
  char *copy = malloc(size + 1);
  check(copy != NULL, "malloc");
  memcpy(copy, data, size);
  copy[size] = '\0';
  char *sections[2 + MAX_OVERRIDES];
  size_t nsec = 0;
  sections[nsec++] = copy;
  size_t job_len = size;
  for (size_t i = 0; i < size; i++) {
    if ((uint8_t)copy[i] != SEPARATOR) continue;
    if (nsec == 1) job_len = i;
    copy[i] = '\0';
    if (nsec == 2 + MAX_OVERRIDES) break;
    sections[nsec++] = copy + i + 1;
  }
  write_job(data, job_len);
  const char *tf = nsec > 1 ? sections[1] : NULL;
  const char *const *ov = (const char *const *)(sections + 2);
  size_t n = nsec > 2 ? nsec - 2 : 0;

  char err[512];
  load(tf, ov, n, err, sizeof err);
  free(copy);
  return 0;
}
