/*
 * The key table: the one description of every key of a job file. The loader validates
 * against it, the reference (docs/configuration.md) is printed from it, and ts_config_free
 * walks it, so a key is added here and nowhere else (CONTRIBUTING.md). Each bound carries its
 * reason in the entry's doc, because the reference shows it to the people who hit it.
 */
#include "ts_config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ts_addr.h"
#include "ts_config_int.h"
#include "ts_err.h"

/* ---- The key table ---------------------------------------------------------------------- */

static bool check_address(const char *value, char *why, size_t whylen) {
  if (ts_addr_split(value, NULL, 0, NULL) == 0) return true;
  snprintf(why, whylen, "\"%s\" is not host:port with a port in 1..65535 ([v6]:port for IPv6)",
           value);
  return false;
}

static bool check_device(const char *value, char *why, size_t whylen) {
  if (value[0] == '/' || value[0] == '\0') return true;
  snprintf(why, whylen, "\"%s\" is not a device name such as \"/cpu:0\" or \"/gpu:0\"", value);
  return false;
}

/* device.rules: "PATTERN=DEVICE", a glob over op names and a device name. */
static bool check_rule(const char *value, char *why, size_t whylen) {
  const char *eq = strchr(value, '=');
  const char *dev = eq ? eq + 1 : NULL;
  while (dev && *dev == ' ') dev++;
  if (eq && eq > value && dev[0] == '/' && strlen(value) <= 255) return true;
  snprintf(why, whylen,
           "\"%s\" is not a rule PATTERN=DEVICE such as \"fc2/*=/cpu:0\" (a glob over op "
           "names, then a device name; at most 255 bytes)",
           value);
  return false;
}

/* Checkpoint file paths are built as DIR/shard-N-SEQUENCE.ckpt in buffers of 600 bytes. */
static bool check_ckpt_dir(const char *value, char *why, size_t whylen) {
  size_t n = strlen(value);
  if (n >= 1 && n <= 512) return true;
  snprintf(why, whylen, "a directory of %zu bytes: 1 to 512 are allowed", n);
  return false;
}

static const char *const mode_names[] = {"sync", "async", "ssp", NULL};
static const int mode_values[] = {TS_MODE_SYNC, TS_MODE_ASYNC, TS_MODE_SSP};
static const char *const optimizer_names[] = {"sgd", "momentum", "adam", NULL};
static const int optimizer_values[] = {TS_OPT_SGD, TS_OPT_MOMENTUM, TS_OPT_ADAM};
static const char *const decay_names[] = {"none", "exponential", "cosine", NULL};
static const int decay_values[] = {TS_DECAY_NONE, TS_DECAY_EXPONENTIAL, TS_DECAY_COSINE};
static const char *const activation_names[] = {"relu", "tanh", NULL};
static const int activation_values[] = {TS_ACT_RELU, TS_ACT_TANH};
static const char *const format_names[] = {"idx", "criteo", NULL};

/* Enum fields are written through an int *: that is only sound while they are int-sized. */
_Static_assert(sizeof(ts_mode_t) == sizeof(int), "enum fields must be int-sized");
_Static_assert(sizeof(ts_optimizer_t) == sizeof(int), "enum fields must be int-sized");
_Static_assert(sizeof(ts_decay_t) == sizeof(int), "enum fields must be int-sized");
_Static_assert(sizeof(ts_activation_t) == sizeof(int), "enum fields must be int-sized");

#define FIELD(f) offsetof(ts_config_t, f)
#define GIB 1073741824LL
#define PATH_BYTES 4095 /* PATH_MAX less the terminating NUL */

/* Shorthand for the common entries; the unusual ones below are spelt out. */
#define HOSTS(key, field, count, lo, dflt, text)                                              \
  {                                                                                           \
    .name = key, .type = TS_CT_STRINGS, .offset = FIELD(field), .member = #field, .count_offset = FIELD(count), \
    .min_len = lo, .max_len = TS_CONFIG_MAX_HOSTS, .check = check_address,                    \
    .check_doc = "host:port", .def = dflt, .doc = text                                        \
  }
#define INT(key, field, lo, hi, dflt, text)                                                      \
  {                                                                                              \
    .name = key, .type = TS_CT_INT, .offset = FIELD(field), .member = #field, .imin = lo, .imax = hi, .def = dflt, \
    .doc = text                                                                                  \
  }
#define INT64(key, field, lo, hi, dflt, text)                                                      \
  {                                                                                                \
    .name = key, .type = TS_CT_INT64, .offset = FIELD(field), .member = #field, .imin = lo, .imax = hi, .def = dflt, \
    .doc = text                                                                                    \
  }
#define FLOAT(key, field, lo, hi, fl, dflt, text)                                                  \
  {                                                                                                \
    .name = key, .type = TS_CT_FLOAT, .offset = FIELD(field), .member = #field, .fmin = lo, .fmax = hi, .flags = fl, \
    .def = dflt, .doc = text                                                                       \
  }
#define BOOL(key, field, dflt, text) \
  { .name = key, .type = TS_CT_BOOL, .offset = FIELD(field), .member = #field, .def = dflt, .doc = text }
#define STRING(key, field, lo, hi, dflt, text)                                               \
  {                                                                                          \
    .name = key, .type = TS_CT_STRING, .offset = FIELD(field), .member = #field, .min_len = lo, .max_len = hi, \
    .def = dflt, .doc = text                                                                 \
  }
#define ENUM(key, field, names, values, dflt, text)                            \
  {                                                                            \
    .name = key, .type = TS_CT_ENUM, .offset = FIELD(field), .member = #field, .choices = names, \
    .choice_values = values, .def = dflt, .doc = text                          \
  }

/* Every key of a job file. Sections appear in this order in docs/configuration.md. */
const ts_config_def_t ts_config_defs[] = {
    HOSTS("cluster.ps", ps, num_ps, 1, "[\"127.0.0.1:7100\"]",
          "Address shard N listens on, one entry per shard. At most 256 shards, the size the "
          "partition plan and status pages are built for."),
    HOSTS("cluster.ps_http", ps_http, num_ps_http, 0, "[]",
          "Admin HTTP address (/metrics, /status, /livez, /readyz) of shard N: empty for none, "
          "else exactly one per shard (checked)."),
    HOSTS("cluster.workers", workers, num_workers, 1, "[\"127.0.0.1:9200\"]",
          "Admin HTTP address of worker T; the list's length is the number of workers. At "
          "most 256, as for shards."),

    ENUM("job.mode", mode, mode_names, mode_values, "\"sync\"",
         "Training mode: synchronous steps, asynchronous updates, or bounded staleness "
         "(docs/architecture.md)."),
    INT("job.replicas_to_aggregate", replicas_to_aggregate, 0, TS_CONFIG_MAX_HOSTS, "0",
        "sync only: gradients averaged per step, 0 = all workers. Fewer makes the rest backup "
        "workers; more than the workers could never be reached (checked)."),
    INT("job.staleness", staleness, 0, 65535, "2",
        "ssp only: clocks the fastest worker may run ahead of the slowest live one. 0 is "
        "lockstep; beyond 65535 it is async in all but name."),
    FLOAT("job.sync_timeout_s", sync_timeout_s, 0.01, 86400.0, 0, "10.0",
          "Longest a sync barrier waits for missing gradients before going on with the live "
          "workers. Positive so a barrier never waits forever; at most a day."),
    FLOAT("job.start_timeout_s", start_timeout_s, 0.0, 86400.0, 0, "120.0",
          "sync only: before the job's first step, longest its shards wait for every worker "
          "of cluster.workers to join, logging every 5 s which are missing; then step 1 "
          "proceeds with those that joined, with a warning naming the others. 0 starts "
          "with the first worker, as job.sync_timeout_s alone would. At most a day."),
    STRING("job.name", job_name, 0, 63, "\"\"",
           "The job's name, part of its identity (ps-server's job id, stored in checkpoints) "
           "when set: two jobs of the same model, job.mode and optimizer.name share an id "
           "unless their names differ, so a shard refuses the other's checkpoint.dir. At "
           "most 63 bytes; empty keeps the id of a job without one."),
    INT("job.min_workers", min_workers, 0, TS_CONFIG_MAX_HOSTS, "0",
        "sync only: workers that must have joined for step 1 to begin without waiting "
        "job.start_timeout_s for the rest, 0 = every worker of cluster.workers. More than "
        "the workers could never be reached (checked)."),
    FLOAT("job.heartbeat_timeout_s", heartbeat_timeout_s, 0.01, 3600.0, 0, "5.0",
          "A worker silent this long is taken for dead. Must exceed job.heartbeat_interval_s "
          "(checked), else live workers would be dropped."),
    FLOAT("job.heartbeat_interval_s", heartbeat_interval_s, 0.01, 3600.0, 0, "1.0",
          "How often a worker sends a heartbeat. At least 10 ms so heartbeats never crowd the "
          "network loop."),
    FLOAT("job.connect_timeout_s", connect_timeout_s, 0.1, 86400.0, 0, "120.0",
          "Longest a worker waits at its start for every shard of cluster.ps to answer its "
          "handshake (shards started after their workers, a shard restarting, a shard's host "
          "name that does not resolve yet), logging which shard it waits for and why every 5 "
          "s; then it gives up and exits 1. At least 0.1 s, "
          "at most a day: a worker waiting longer is better restarted by its supervisor."),
    INT("job.busy_poll_us", busy_poll_us, 0, 1000000, "50",
        "Microseconds a network thread (a shard's loop, a worker's client thread and the "
        "thread waiting for a reply) keeps polling without sleeping after its last message, "
        "so a quick reply is picked up without a wake-up from sleep (tens to hundreds of "
        "microseconds on virtual machines). Polling threads yield to any other runnable "
        "thread, and an idle process never polls. 0 = always sleep; at most 1 s."),
    {.name = "job.partition_bytes",
     .type = TS_CT_INT64,
     .offset = FIELD(partition_bytes),
     .member = "partition_bytes",
     .imin = 4,
     .imax = GIB,
     .multiple = 4,
     .def = "4194304",
     .doc = "Largest partition of a tensor, in bytes. Parameters are float32, hence a multiple "
            "of 4; at most 1 GiB and at most server.max_message_bytes, so one partition "
            "always fits one frame (checked)."},

    INT64("server.max_message_bytes", max_message_bytes, 1048576, 16 * GIB, "1073741824",
          "Largest frame payload a shard accepts; a larger frame closes its connection before "
          "anything is allocated. At least 1 MiB (the largest meta), at most 16 GiB."),
    INT("server.max_connections", max_connections, 1, 65536, "1024",
        "Authenticated connections a shard holds at once (counted once the handshake "
        "succeeds: connections still in their handshake have their own quota, "
        "server.max_preauth_connections, and never take these). More are refused with "
        "EBUSY. Beyond 65536 the file-descriptor limit would refuse them anyway."),
    INT("server.max_preauth_connections", max_preauth_connections, 1, 65536, "128",
        "Connections still in their handshake (not yet authenticated) a shard holds at once. "
        "When a new one arrives and the quota is full, the oldest one waiting is closed: a "
        "real client handshakes within a round trip, so the oldest is the likeliest idle "
        "attacker, and refusing the newest instead would let idle sockets lock clients out. "
        "At least 1, at most 65536 (the file-descriptor limit)."),
    FLOAT("server.handshake_timeout_s", handshake_timeout_s, 0.05, 600.0, 0, "5.0",
          "Longest a connection may take from its accept to a successful handshake; then it "
          "is closed. A client answers the Hello within a round trip; 5 s covers slow "
          "networks and loaded hosts. At least 50 ms (a few ticks), at most 10 minutes."),
    INT("server.max_handshake_bytes", max_handshake_bytes, 2048, 1048576, "4096",
        "Largest frame meta accepted before the handshake succeeds (the handshake itself: a "
        "MAC, the worker's identity text and its job settings); a larger one closes the "
        "connection before anything is allocated, so an unauthenticated peer holds a few KiB "
        "at most. At least 2048 bytes (a worker's handshake with a 127-byte identity and the "
        "settings of a 64-layer model takes about 1.3 KiB), at most 1 MiB (any meta)."),
    FLOAT("server.frame_grace_s", frame_grace_s, 0.05, 86400.0, 0, "10.0",
          "Time a frame in progress may take, whatever its rate; after it the frame must "
          "have arrived at server.min_recv_bytes_per_s on average (time the shard itself "
          "held reading back is not counted) or its connection is closed. At least 50 ms, "
          "at most a day."),
    INT64("server.min_recv_bytes_per_s", min_recv_bytes_per_s, 0, GIB, "4096",
          "Slowest average rate a frame past server.frame_grace_s may arrive at, in bytes per "
          "second; slower (a peer trickling a frame to hold the connection and its buffers) "
          "closes it. 4 KiB/s is a thirtieth of a 1 Mbit/s link, so a real transfer is never "
          "hit (a 400 MiB push on loopback runs at GiB/s). 0 turns the rate check off (not "
          "the handshake deadline); at most 1 GiB/s."),

    INT64("server.push_min_bytes_per_s", push_min_bytes_per_s, 0, GIB, "65536",
          "Slowest a push may arrive while it holds one of the shard's staging buffers, in bytes "
          "a second over each server.push_rate_window_s; a slower push is dropped (its "
          "connection closed), so a peer trickling bytes cannot keep the pool from the others. "
          "0 turns the floor off; at most 1 GiB/s, since faster than loopback drops everyone."),
    FLOAT("server.push_rate_window_s", push_rate_window_s, 0.1, 600.0, 0, "5.0",
          "Window over which server.push_min_bytes_per_s is measured. At least 0.1 s (the "
          "shard's tick); at most 600 s, beyond which a trickler holds the pool for ten minutes."),
    INT64("server.push_contended_min_bytes_per_s", push_contended_min_bytes_per_s, 0, GIB, "1048576",
          "Slowest a push may arrive while it holds a staging buffer and other pushes wait for "
          "one (the pool is exhausted), in bytes a second, judged after min(1 s, "
          "server.push_rate_window_s) of holding; a slower push is dropped and its buffer goes "
          "to the next push in line, so tricklers just above server.push_min_bytes_per_s cannot "
          "monopolise the pool. 1 MiB/s is about 8 Mbit/s: lower it for workers on slower links. "
          "0 (or a value below server.push_min_bytes_per_s) turns it off; at most 1 GiB/s."),
    FLOAT("server.pull_hold_timeout_s", pull_hold_timeout_s, 0.1, 3600.0, 0, "10.0",
          "Longest a pull reply still being written may keep an update of its partitions "
          "waiting, counted from when an update first waits for it (to the shard's tick), not "
          "from when the reply was queued: a large reply over a slow link, or one queued behind "
          "others, is not cut while no update waits for it. Past it the reader's connection is "
          "closed, so a slow reader holds no partition hostage. At least 0.1 s (the shard's "
          "tick), at most an hour."),
    INT64("server.max_reply_bytes_per_connection", max_reply_bytes_per_connection, 65536,
          16 * GIB, "16777216",
          "Memory the replies queued to one connection may take (their structs, encoded "
          "frames and allocator overhead; a pull reply's values are parameter memory and not "
          "counted). Over it the shard stops reading that connection until half is written. "
          "At least 64 KiB (a few status replies), at most 16 GiB."),
    INT64("server.max_reply_bytes", max_reply_bytes, 65536, 64 * GIB, "67108864",
          "Memory the replies queued to all connections together may take; over it the "
          "connection with the most queued is closed first. 64 MiB: what all peers together "
          "can make a shard hold in replies they do not read. A table pull whose reply would "
          "not fit it is refused (ETOOBIG), and the shard tells clients how many bytes of rows "
          "a reply may carry (libtessera-client cuts its pulls to 16 MiB of rows, or to that "
          "when less). At least 64 KiB, at most 64 GiB."),
    INT64("server.max_status_reply_bytes", max_status_reply_bytes, 65536, 64 * GIB, "4194304",
          "Of those, the memory queued Status replies may take (psctl status, the client "
          "library's ts_client_status), so that peers asking for status faster than they "
          "read cannot crowd out workers' replies: one connection may hold 1/64 of it "
          "(at least 16 KiB) and is closed over that; over the whole, the connection with "
          "the most queued Status replies is closed first. At least 64 KiB, at most 64 GiB."),
    FLOAT("server.reply_full_timeout_s", reply_full_timeout_s, 0.1, 3600.0, 0, "10.0",
          "A connection whose queued replies stay above half of "
          "server.max_reply_bytes_per_connection this long (it asks faster than it reads) is "
          "closed. At least 0.1 s (the shard's tick), at most an hour."),
    INT("server.max_parked_pulls", max_parked_pulls, 1, 65536, "64",
        "Pulls one connection may have waiting for a version or clock at once; more are "
        "answered EBUSY. A worker parks one per shard and step; at most 65536."),
    INT("server.push_dedup_clients", push_dedup_clients, 0, 64, "4",
        "Clients (ps-worker or library instances) per worker task whose push ids a shard "
        "remembers, so a retried push is applied once; each takes 16 bytes per partition and "
        "64 per table of the shard. A client past it takes the least recently used one's place. 0 turns "
        "retry detection off; at most 64."),
    FLOAT("server.max_pull_wait_s", max_pull_wait_s, 1.0, 86400.0, 0, "300.0",
          "Longest a pull waits for its version; a longer client timeout is clamped to it (the "
          "pull is then answered ETIMEDOUT). At least 1 s (the shortest wait), at most a day."),

    INT64("server.max_model_bytes", max_model_bytes, 1048576, 4096 * GIB, "17179869184",
          "Most memory a declared model may make one shard allocate: its share of the "
          "parameters, their optimizer state (momentum's velocity, Adam's two moments), sync "
          "accumulators and the partition tables. A Declare beyond it is refused before "
          "anything is allocated. 16 GiB holds a share of about a billion parameters with "
          "Adam; set it below the shard machine's free memory. At least 1 MiB, at most 4 TiB."),

    INT64("server.max_table_bytes", max_table_bytes, 1048576, 4096 * GIB, "4294967296",
          "Most memory the embedding tables of a model (Declare.tables) may hold on one shard, "
          "all tables together: rows, their optimizer state, indexes, admission sketches and "
          "sync accumulators. Checked before every row is made: a table at the budget makes "
          "room by evicting its least recently used rows, and a key that finds no room is "
          "served the initialiser's row without being stored. In sync mode rows leave 1/8 of "
          "it to each step's gradient sums. At least 1 MiB, at most 4 TiB."),

    INT("http.max_connections", http_max_connections, 4, 4096, "256",
        "Connections an admin HTTP endpoint (/metrics, /livez, /readyz, /status of shards and "
        "workers) serves at once. A new one past this closes the oldest, so a probe always "
        "gets in. At least 4, at most 4096 (file descriptors)."),
    INT("http.max_connections_per_ip", http_max_connections_per_ip, 1, 4096, "32",
        "Connections one client address may hold on an admin endpoint; a new one past this "
        "closes that address's oldest, so one address cannot take every slot. At least 1, "
        "at most 4096."),
    FLOAT("http.request_timeout_s", http_request_timeout_s, 0.1, 3600.0, 0, "5.0",
          "Longest an admin HTTP request may take, from the connection's start (or the end "
          "of its previous request) to its reply: a client sending a byte now and then "
          "(slowloris) is closed after this whatever its rate. A scrape takes milliseconds; "
          "at least 0.1 s, at most an hour."),

    ENUM("optimizer.name", optimizer, optimizer_names, optimizer_values, "\"sgd\"",
         "Update rule applied on the shards. Its state (velocity, Adam moments) lives beside "
         "each partition."),
    FLOAT("optimizer.learning_rate", learning_rate, 0.0, 1000.0, TS_CF_OPEN_MIN, "0.1",
          "Step size. Positive, since 0 never trains; above 1000 training only diverges."),
    FLOAT("optimizer.momentum", momentum, 0.0, 1.0, TS_CF_OPEN_MAX, "0.9",
          "momentum only: decay of the velocity. Below 1, since at 1 the velocity never decays "
          "and training diverges."),
    FLOAT("optimizer.beta1", beta1, 0.0, 1.0, TS_CF_OPEN_MAX, "0.9",
          "adam only: decay of the first-moment estimate. Below 1, since Adam's bias "
          "correction divides by 1 - beta1^t."),
    FLOAT("optimizer.beta2", beta2, 0.0, 1.0, TS_CF_OPEN_MAX, "0.999",
          "adam only: decay of the second-moment estimate. Below 1, for the same bias "
          "correction."),
    FLOAT("optimizer.epsilon", epsilon, 0.0, 1.0, TS_CF_OPEN_MIN, "1e-8",
          "adam only: added to the denominator. Positive, so a zero second moment never "
          "divides by zero."),
    ENUM("optimizer.decay", decay, decay_names, decay_values, "\"none\"",
         "Schedule of the learning rate over a partition's updates t (0 for its first; "
         "the global step in sync mode, each worker's push in async and ssp, and restored "
         "with the partition from a checkpoint): \"none\" keeps learning_rate; "
         "\"exponential\" is TensorFlow's exponential_decay, learning_rate * "
         "decay_rate^(t / decay_steps); \"cosine\" is Keras' CosineDecay, from "
         "learning_rate down to learning_rate * decay_alpha over decay_steps updates, then "
         "constant. A rate that falls lets the last updates settle the parameters "
         "instead of moving them by a full step each."),
    INT64("optimizer.decay_steps", decay_steps, 1, INT64_MAX, "1000",
          "exponential and cosine only: updates over which the rate falls by decay_rate "
          "(exponential) or to its floor (cosine). At least 1."),
    FLOAT("optimizer.decay_rate", decay_rate, 0.0, 1.0, TS_CF_OPEN_MIN, "0.96",
          "exponential only: the factor the rate is multiplied by every decay_steps updates. "
          "Positive, since 0 stops training after one update; at most 1 (1 is no decay)."),
    BOOL("optimizer.staircase", staircase, "false",
         "exponential only: true lowers the rate in whole steps (t / decay_steps rounded "
         "down), as TensorFlow's staircase; false lowers it at every update."),
    FLOAT("optimizer.decay_alpha", decay_alpha, 0.0, 1.0, 0, "0.0",
          "cosine only: the rate at the end of the schedule, as a fraction of learning_rate. "
          "0 to 1."),

    {.name = "model.layers",
     .type = TS_CT_LAYERS,
     .offset = FIELD(layers),
     .member = "layers",
     .count_offset = FIELD(num_layers),
     .imin = 1,
     .imax = 1048576,
     .min_len = 2,
     .max_len = TS_CONFIG_MAX_LAYERS,
     .def = "[784, 128, 10]",
     .doc = "Layer widths from input to output; [784, 10] is logistic regression. At least 2 "
            "(an input and an output), at most 64 (TS_CONFIG_MAX_LAYERS); a width above 2^20 "
            "would make one weight matrix larger than host memory. "
            "Or a list of layers, one group each: conv2d (filters, kernel, strides, padding, "
            "activation), max_pool (size, strides, padding), flatten, dense (units, activation), "
            "dropout (rate), each with an optional name, and, for data.format \"criteo\", "
            "embedding (table, dim, field: a categorical field 1..26 or a list of them) before "
            "all others, then optionally dot (DLRM's pairwise dot interactions) "
            "(docs/embeddings.md, deploy/local/ctr.cfg); see deploy/local/lenet5.cfg. The input "
            "shape then comes from the images (28x28x1), the last layer must be a dense layer "
            "without activation (the logits), and a layer that does not fit is named with its "
            "file:line. At most 64 layers."},
    ENUM("model.activation", activation, activation_names, activation_values, "\"relu\"",
         "Activation of the hidden layers."),
    INT64("model.seed", seed, 0, INT64_MAX, "42",
          "Seeds parameter initialisation and the data order: the same seed gives the same "
          "run. Non-negative, so it reads the same as the unsigned 64-bit value it becomes."),

    {.name = "data.format",
     .type = TS_CT_STRING,
     .offset = FIELD(data_format),
     .member = "data_format",
     .min_len = 1,
     .max_len = 16,
     .choices = format_names,
     .def = "\"idx\"",
     .doc = "Format of the data files: \"idx\", IDX files, gzip-compressed or not (the MNIST "
            "family, data.*_images and data.*_labels), or \"criteo\", click logs in the "
            "Criteo TSV format (data.train_path, data.test_path; a model whose layers start "
            "with embedding layers, docs/embeddings.md)."},
    STRING("data.train_images", train_images, 1, PATH_BYTES,
           "\"/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz\"",
           "Training images (Debian's dataset-fashion-mnist by default). A path: 1 to 4095 "
           "bytes (PATH_MAX)."),
    STRING("data.train_labels", train_labels, 1, PATH_BYTES,
           "\"/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz\"",
           "Training labels, one per training image. A path: 1 to 4095 bytes."),
    STRING("data.test_images", test_images, 1, PATH_BYTES,
           "\"/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz\"",
           "Test images, for test_accuracy. A path: 1 to 4095 bytes."),
    STRING("data.test_labels", test_labels, 1, PATH_BYTES,
           "\"/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz\"",
           "Test labels, one per test image. A path: 1 to 4095 bytes."),
    STRING("data.train_path", train_path, 0, PATH_BYTES, "\"\"",
           "data.format \"criteo\": the training rows, Criteo TSV (label, 13 integers, 26 hex "
           "categoricals, tab-separated, a missing value empty), plain or gzip, read as a "
           "stream. A path: up to 4095 bytes."),
    STRING("data.test_path", test_path, 0, PATH_BYTES, "\"\"",
           "data.format \"criteo\": the rows the log loss and AUC are measured on at the end, "
           "the same format. A path: up to 4095 bytes."),

    INT("train.batch_size", batch_size, 1, 65536, "64",
        "Examples per worker per step (a step covers workers x batch_size examples). At most "
        "65536 so one batch of activations fits device memory."),
    INT("train.epochs", epochs, 1, 1000000, "1",
        "Passes over the training set. At least 1; train.max_steps can stop earlier."),
    INT("train.state_every", state_every, 1, 1000000, "1",
        "Steps between a worker's pushes of its state tensors' values (a Keras model's "
        "BatchNormalization moving statistics and other non-trainable variables, which the "
        "shards keep as the workers' mean). 1 = every step; more saves the bytes of large "
        "frozen layers. At least 1; at most a million."),
    INT64("train.max_steps", max_steps, 0, INT64_MAX, "0",
          "Stop when the job's global step reaches this; 0 = no step limit. The global step "
          "is TensorFlow's: the number of updates the shards applied. In sync mode one update "
          "is one step of every worker (their gradients averaged), so each worker makes "
          "max_steps steps; in async and ssp mode every push is an update, so the workers "
          "make max_steps steps together (each about max_steps / workers, a few more in all "
          "when the last ones race)."),
    STRING("train.logdir", logdir, 0, PATH_BYTES, "\"\"",
           "Directory for TensorBoard event files; empty = none. A path: at most 4095 bytes."),
    STRING("train.run_name", run_name, 0, 255, "\"\"",
           "The TensorBoard run a worker writes under: train.logdir/RUN/worker-T/{train,"
           "validation}. Empty: the time the worker started (UTC, 20261202-113501), so each "
           "start is a run of its own; give a job's workers one name to see them together. "
           "One directory name: no '/', at most 255 bytes."),
    FLOAT("train.log_interval_s", log_interval_s, 0.1, 86400.0, 0, "5.0",
          "Seconds between progress lines in a worker's log. At least 0.1 s so logging never "
          "dominates a step; at most a day. On a terminal ps-worker also redraws a live "
          "progress line in place; elsewhere it also logs at each tenth of an epoch, at most "
          "ten times a second, so a short epoch still shows several lines."),
    FLOAT("train.stall_timeout_s", stall_timeout_s, 0.0, 86400.0, 0, "0.0",
          "A worker's /livez answers 503 (with what the training loop waits on) when the loop "
          "has not advanced for this long: no phase of a step (pull, compute, push), no "
          "evaluation, no answer from shard 0 while waiting for the other workers at the "
          "end. Retries of a request to an unreachable shard are not progress. 0 = "
          "max(60, 2 x (job.sync_timeout_s + job.heartbeat_timeout_s)). Otherwise it must "
          "exceed job.sync_timeout_s + job.heartbeat_timeout_s, the longest a sync barrier "
          "legitimately holds a pull; set it above the slowest step too. At most a day."),

    {.name = "device.placement",
     .type = TS_CT_STRING,
     .offset = FIELD(placement),
     .member = "placement",
     .min_len = 0,
     .max_len = 255,
     .check = check_device,
     .check_doc = "empty, or a device name starting with /",
     .def = "\"\"",
     .doc = "Device for the model's ops, TensorFlow style: /cpu:0, /gpu:N or "
            "/job:worker/replica:0/task:T/device:GPU:N. Empty (the default) is TensorFlow's "
            "own choice: each op on /gpu:0 when a GPU is visible and has a kernel for it, "
            "else on /cpu:0, silently. The input pipeline's ops are outside this scope "
            "(docs/gpu.md)."},
    {.name = "device.rules",
     .type = TS_CT_STRINGS,
     .offset = FIELD(placement_rules),
     .member = "placement_rules",
     .count_offset = FIELD(num_placement_rules),
     .min_len = 0,
     .max_len = 64,
     .check = check_rule,
     .check_doc = "PATTERN=DEVICE",
     .def = "[]",
     .doc = "Per-op and per-layer placement, as tf.device scopes: an ordered list of "
            "\"PATTERN=DEVICE\", PATTERN a glob matched against each op's name "
            "(\"fc2/matmul\") and its layer (\"fc2\"); the first rule that matches gives "
            "the op an explicit device, the others take device.placement. E.g. "
            "[\"input/*=/cpu:0\", \"conv*=/gpu:0\"]. At most 64 rules."},
    BOOL("device.allow_soft_placement", allow_soft_placement, "false",
         "When an op's explicit device is missing or has no kernel for it, place that op "
         "(only that op) on another device and log why, instead of failing with "
         "TensorFlow's message. False by default, as TensorFlow 1's ConfigProto."),
    BOOL("device.log_device_placement", log_device_placement, "false",
         "Log, in TensorFlow's format, one line per op of every tower with the device it "
         "was placed on, and one per variable (partition) with the shard that holds it."),
    BOOL("device.allow_growth", allow_growth, "true",
         "Take GPU memory as needed rather than reserving it up front (TensorFlow's "
         "GPUOptions.allow_growth). With device.memory_fraction > 0 the pool grows up to that "
         "fraction and no further; false with a fraction of 0 reserves 90% of the free memory "
         "at start (TensorFlow's default)."),
    FLOAT("device.memory_fraction", memory_fraction, 0.0, 1.0, 0, "0.0",
          "The most of each GPU's total memory the worker's pool may hold (TensorFlow's "
          "per_process_gpu_memory_fraction), rounded down to 2 MiB: reserved up front when "
          "device.allow_growth = false, grown into on demand when true; 0 = no limit of our "
          "own. A fraction, so within [0, 1]."),
    INT("device.towers", towers, 0, 64, "0",
        "Model replicas (towers) per worker, each on its own micro-batch of train.batch_size "
        "/ towers examples (so batch_size must be a multiple). 0 = one per visible GPU when "
        "the ops are placed on a GPU, else 1; more towers than GPUs share them round-robin. "
        "At most 64 (NCCL's ranks per process here)."),
    INT("device.intra_op_parallelism_threads", intra_op_threads, 0, 1024, "0",
        "Threads one op may use on the CPU (TensorFlow's intra_op_parallelism_threads): "
        "OpenBLAS's matrix products, and so the dense layers and the convolutions' im2col "
        "products. 0 = OPENBLAS_NUM_THREADS (or OMP_NUM_THREADS) when set, else the CPUs this "
        "process may use divided among the job's workers on the same host (cluster.workers "
        "entries with this worker's host; loopback addresses are one host), at least 1, so "
        "workers sharing a machine do not oversubscribe it. At most 1024."),
    BOOL("device.allow_tf32", allow_tf32, "false",
         "Let cuBLAS and cuDNN round float32 matrix products and convolutions through TF32 "
         "tensor cores (faster, about 3 decimal digits); off, they are full float32 like the "
         "CPU's."),

    STRING("checkpoint.dir", checkpoint_dir, 0, PATH_BYTES, "\"\"",
           "Directory each shard writes checkpoints to; empty = no checkpoints. A path: at "
           "most 4095 bytes. Made and write-tested at start (a file written, fsynced, "
           "removed): a directory that takes no file stops the start (exit 78), and so do "
           "checkpoints of the shard that are all unusable, unless ps-server --fresh "
           "(docs/operations.md)."),
    FLOAT("checkpoint.interval_s", checkpoint_interval_s, 0.1, 604800.0, 0, "60",
          "Seconds between checkpoints (taken only when parameters changed). At least 0.1 s: "
          "each one fsyncs the shard's partitions; at most a week."),
    INT("checkpoint.keep", checkpoint_keep, 1, 1000, "3",
        "Checkpoints kept per shard. At least 1 so a restart has one to restore; at most 1000 "
        "to bound disk use."),
    INT("checkpoint.full_every", checkpoint_full_every, 1, 1000000, "10",
        "Every how many periodic checkpoints one is full: the others write the embedding "
        "tables' rows changed since the last full one only (and the keys erased since), with "
        "the dense parameters whole; a restore reads the full one and the newest such "
        "increment. 1 = every checkpoint full. psctl checkpoint, shutdown and SIGTERM always "
        "write a full one."),
    BOOL("checkpoint.sign", checkpoint_sign, "false",
         "Sign checkpoints: their hash is keyed with a key derived from the admin token "
         "(auth.admin_token_file, required), so whoever can write checkpoint.dir without "
         "the token cannot make a file the shard restores. A shard with sign = true refuses "
         "unsigned files and files signed with another token; one without refuses signed "
         "files (docs/security.md)."),
    {.name = "checkpoint.restore_from",
     .type = TS_CT_STRINGS,
     .offset = FIELD(checkpoint_restore_from),
     .member = "checkpoint_restore_from",
     .count_offset = FIELD(num_checkpoint_restore_from),
     .min_len = 0,
     .max_len = TS_CONFIG_MAX_HOSTS,
     .check = check_ckpt_dir,
     .check_doc = "a directory of 1 to 512 bytes",
     .def = "[]",
     .doc = "More directories to re-shard from: where the shards of a job with another shard "
            "count or job.partition_bytes wrote their checkpoints (e.g. each old shard's own "
            "state directory), only ever read, at start. When checkpoint.dir holds no "
            "checkpoint of this shard's own layout (or an older one), the newest complete set "
            "(a file of every old shard at one step) in checkpoint.dir and these is restored, "
            "each shard taking its partitions under the new plan (docs/operations.md). At "
            "most 256, one per old shard."},

    STRING("auth.token_file", token_file, 0, PATH_BYTES, "\"\"",
           "File holding the shared token workers authenticate with; empty = no "
           "authentication, and servers then listen on loopback only. A worker's file may "
           "hold its task key instead (psctl token derive), which proves its task "
           "(docs/security.md)."),
    STRING("auth.admin_token_file", admin_token_file, 0, PATH_BYTES, "\"\"",
           "File holding the admin token psctl needs for admin requests (checkpoint, "
           "shutdown, model reset); empty = none. psctl reads status with the worker token "
           "when this file is not readable on its host."),
    BOOL("auth.tls", tls, "false",
         "TLS 1.3 on every shard connection (workers, psctl, the Python package) and on the "
         "admin HTTP endpoint (HTTPS), with the three files below: each side verifies the "
         "other's certificate against auth.tls_ca_file (mutual TLS), and a client checks that "
         "the shard's certificate names the address it dialled. Every process of the job "
         "must agree: a plaintext peer on a TLS port is refused with an error saying so "
         "(docs/security.md)."),
    STRING("auth.tls_ca_file", tls_ca_file, 0, PATH_BYTES, "\"\"",
           "PEM file of the CA (or CAs) that sign the job's certificates: shards verify "
           "clients with it, clients verify shards. Needed with auth.tls."),
    STRING("auth.tls_cert_file", tls_cert_file, 0, PATH_BYTES, "\"\"",
           "PEM file of this host's certificate (then its chain). A shard's must name its "
           "cluster.ps address in subjectAltName (an IP address or a DNS name). Needed with "
           "auth.tls."),
    STRING("auth.tls_key_file", tls_key_file, 0, PATH_BYTES, "\"\"",
           "PEM file of the private key of auth.tls_cert_file (readable by the daemon's user "
           "only). Needed with auth.tls."),
};

const size_t ts_config_ndefs = sizeof ts_config_defs / sizeof ts_config_defs[0];

/* ---- Lookups --------------------------------------------------------------------------- */

const ts_config_def_t *ts_config_find_def(const char *name) {
  for (size_t i = 0; i < ts_config_ndefs; i++)
    if (strcmp(ts_config_defs[i].name, name) == 0) return &ts_config_defs[i];
  return NULL;
}

const ts_config_def_t *ts_config_def_named(const char *name) {
  const ts_config_def_t *d = ts_config_find_def(name);
  ts_require(d != NULL);
  return d;
}

bool ts_config_is_section(const char *name) {
  size_t n = strlen(name);
  for (size_t i = 0; i < ts_config_ndefs; i++)
    if (strncmp(ts_config_defs[i].name, name, n) == 0 && ts_config_defs[i].name[n] == '.')
      return true;
  return false;
}

/* ---- Did you mean ----------------------------------------------------------------------- */

/* Edit distance counting a swap of neighbours as one edit ("moed" -> "mode"): the optimal
 * string alignment distance, over three rows. */
static size_t edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la >= TS_CONFIG_KEY_LEN || lb >= TS_CONFIG_KEY_LEN) return SIZE_MAX;
  size_t rows[3][TS_CONFIG_KEY_LEN + 1];
  size_t *prev2 = rows[0], *prev = rows[1], *cur = rows[2];
  for (size_t j = 0; j <= lb; j++) prev[j] = j;
  for (size_t i = 1; i <= la; i++) {
    cur[0] = i;
    for (size_t j = 1; j <= lb; j++) {
      size_t best = prev[j - 1] + (a[i - 1] != b[j - 1]);
      if (prev[j] + 1 < best) best = prev[j] + 1;
      if (cur[j - 1] + 1 < best) best = cur[j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && prev2[j - 2] + 1 < best)
        best = prev2[j - 2] + 1;
      cur[j] = best;
    }
    size_t *t = prev2;
    prev2 = prev;
    prev = cur;
    cur = t;
  }
  return prev[lb];
}

/* Copies s into out (outlen > 0), cutting it short when it does not fit. */
static void copy_str(char *out, size_t outlen, const char *s) {
  size_t n = strlen(s);
  if (n >= outlen) n = outlen - 1;
  memcpy(out, s, n);
  out[n] = '\0';
}

/* The key closest to an unknown dotted name, or the section closest to an unknown top-level
 * one ("jbo" -> "job"); empty when none is close. A key with the same last part in another
 * section ("job.batch_size" -> "train.batch_size") is the fallback. */
void ts_config_suggest(const char *name, char *out, size_t outlen) {
  size_t best = SIZE_MAX;
  bool dotted = strchr(name, '.') != NULL;
  out[0] = '\0';
  for (size_t i = 0; i < ts_config_ndefs; i++) {
    const char *key = ts_config_defs[i].name;
    char section[TS_CONFIG_KEY_LEN];
    snprintf(section, sizeof section, "%.*s", (int)(strchr(key, '.') - key), key);
    const char *cand = dotted ? key : section;
    size_t dist = edit_distance(name, cand);
    if (dist < best) {
      best = dist;
      copy_str(out, outlen, cand);
    }
  }
  if (best <= 1 + strlen(name) / 6) return; /* "optimizer.lr" is not "optimizer.name" */
  out[0] = '\0';
  const char *last = strrchr(name, '.');
  if (!last) return;
  for (size_t i = 0; i < ts_config_ndefs; i++)
    if (strcmp(strrchr(ts_config_defs[i].name, '.'), last) == 0) {
      copy_str(out, outlen, ts_config_defs[i].name);
      return;
    }
}

/* ---- Bounds, in words ------------------------------------------------------------------- */

void ts_config_describe_int_bounds(const ts_config_def_t *d, char *buf, size_t n) {
  snprintf(buf, n, "[%lld, %lld]", (long long)d->imin, (long long)d->imax);
}

void ts_config_describe_float_bounds(const ts_config_def_t *d, char *buf, size_t n) {
  snprintf(buf, n, "%c%g, %g%c", (d->flags & TS_CF_OPEN_MIN) ? '(' : '[', d->fmin, d->fmax,
           (d->flags & TS_CF_OPEN_MAX) ? ')' : ']');
}

/* ---- Enum names ------------------------------------------------------------------------ */

/* Read from the table, so the spelling logs and /status print is the one a job file takes. */
static const char *choice_name(const ts_config_def_t *d, int value) {
  for (size_t i = 0; d->choices[i]; i++)
    if (d->choice_values[i] == value) return d->choices[i];
  return "unknown";
}

const char *ts_mode_name(ts_mode_t mode) {
  return choice_name(ts_config_def_named("job.mode"), (int)mode);
}

const char *ts_optimizer_name(ts_optimizer_t opt) {
  return choice_name(ts_config_def_named("optimizer.name"), (int)opt);
}

const char *ts_decay_name(ts_decay_t decay) {
  return choice_name(ts_config_def_named("optimizer.decay"), (int)decay);
}

double ts_config_stall_timeout_s(const ts_config_t *cfg) {
  if (cfg->stall_timeout_s > 0) return cfg->stall_timeout_s;
  double t = 2.0 * (cfg->sync_timeout_s + cfg->heartbeat_timeout_s);
  return t > 60.0 ? t : 60.0;
}
