/*
 * Writes the seed corpora of fuzz_frame (tests/fuzz/corpus/frame/) and fuzz_msg
 * (tests/fuzz/corpus/msg/): one valid message of every type, then ones that each break one
 * rule (header limits, payload sizes, Declare limits, malformed meta, truncation). Messages
 * are packed with protobuf-c, so the valid ones are valid by construction. fuzz_frame gets
 * whole frames; fuzz_msg gets u8 type, u64 data_len (little-endian) and the meta. Run:
 * make_corpus frame|msg OUTDIR (the files are committed; rerun only when the protocol
 * changes). Each file's name starts with its target ("msg-01-hello"), so that no two files
 * of the repository share a name.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ts_frame.h"
#include "ts_msg.h"

static const char *outdir, *target;
static int msg_mode; /* fuzz_msg's input format instead of whole frames */
static int failures;

static void write_file(const char *name, const uint8_t *data, size_t len) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s-%s", outdir, target, name);
  FILE *f = fopen(path, "wb");
  if (!f || (len && fwrite(data, 1, len, f) != len) || fclose(f) != 0) {
    fprintf(stderr, "make_corpus: cannot write %s: %s\n", path, strerror(errno));
    failures++;
  }
}

/* fuzz_msg's input: type, data_len, then meta_bytes of meta. */
static void write_msg(const char *name, uint8_t type, uint64_t data_len, const uint8_t *meta,
                      size_t meta_bytes) {
  uint8_t *buf = malloc(9 + meta_bytes);
  if (!buf) abort();
  buf[0] = type;
  for (int i = 0; i < 8; i++) buf[1 + i] = (uint8_t)(data_len >> (8 * i));
  if (meta_bytes) memcpy(buf + 9, meta, meta_bytes);
  write_file(name, buf, 9 + meta_bytes);
  free(buf);
}

/* A frame of msg with data_len in the header; `payload` bytes of payload follow (up to
 * data_len), and the file is cut to `cut` bytes when cut is not 0. In msg mode: the meta
 * (cut where the frame would be) after type and data_len; the payload is left out. */
static void write_frame(const char *name, uint16_t type, const ProtobufCMessage *msg,
                        uint64_t data_len, size_t payload, size_t cut) {
  size_t n = ts_msg_frame_size(msg);
  if (msg_mode) {
    uint8_t *meta = malloc(n);
    if (!meta) abort();
    size_t meta_bytes = protobuf_c_message_pack(msg, meta);
    if (cut) meta_bytes = cut > TS_FRAME_HEADER_SIZE ? cut - TS_FRAME_HEADER_SIZE : 0;
    write_msg(name, (uint8_t)type, data_len, meta, meta_bytes);
    free(meta);
    return;
  }
  uint8_t *buf = calloc(1, n + payload);
  if (!buf) abort();
  ts_msg_encode(type, msg, data_len, buf);
  /* Payload: float32 values 0.5, 1.5, ... little-endian (0x3f000000 = 0.5f). */
  for (size_t i = 0; i + 4 <= payload; i += 4) {
    buf[n + i + 2] = (uint8_t)(i / 4);
    buf[n + i + 3] = 0x3f;
  }
  write_file(name, buf, cut ? cut : n + payload);
  free(buf);
}

/* A header followed by raw meta bytes. */
static void write_raw(const char *name, uint16_t version, uint16_t type, uint32_t meta_len,
                      uint64_t data_len, const char *meta, size_t meta_bytes) {
  uint8_t buf[64];
  if (meta_bytes > sizeof buf - TS_FRAME_HEADER_SIZE) abort();
  ts_frame_encode_header(buf, type, meta_len, data_len);
  buf[4] = (uint8_t)version;
  buf[5] = (uint8_t)(version >> 8);
  memcpy(buf + TS_FRAME_HEADER_SIZE, meta, meta_bytes);
  write_file(name, buf, TS_FRAME_HEADER_SIZE + meta_bytes);
}

static Tessera__PartSlice slices[4];
static Tessera__PartSlice *slice_ptrs[4];

static void set_slices(uint64_t count) {
  for (int i = 0; i < 4; i++) {
    Tessera__PartSlice s = TESSERA__PART_SLICE__INIT;
    s.tensor = (uint32_t)i;
    s.part = (uint32_t)(i % 2);
    s.count = count;
    s.version = 3;
    slices[i] = s;
    slice_ptrs[i] = &slices[i];
  }
}

static void valid_frames(void) {
  uint8_t nonce[32];
  for (int i = 0; i < 32; i++) nonce[i] = (uint8_t)(0xa0 + i);
  Tessera__Hello hello = TESSERA__HELLO__INIT;
  hello.protocol = 1;
  hello.shard = 1;
  hello.num_shards = 2;
  hello.nonce.data = nonce;
  hello.nonce.len = sizeof nonce;
  hello.server_id = "ps-server/0.1.0 shard 1";
  write_frame("01-hello", TS_MSG_HELLO, &hello.base, 0, 0, 0);

  Tessera__Handshake hs = TESSERA__HANDSHAKE__INIT;
  hs.request_id = 1;
  hs.protocol = 1;
  hs.role = TESSERA__ROLE__ROLE_WORKER;
  hs.task = 0;
  hs.identity = "ps-worker task 0 pid 1234@host";
  hs.mac.data = nonce;
  hs.mac.len = sizeof nonce;
  write_frame("02-handshake", TS_MSG_HANDSHAKE, &hs.base, 0, 0, 0);

  Tessera__HandshakeReply hr = TESSERA__HANDSHAKE_REPLY__INIT;
  hr.request_id = 1;
  hr.shard = 1;
  hr.num_shards = 2;
  hr.mode = TESSERA__MODE__MODE_SYNC;
  hr.partition_bytes = 4194304;
  hr.num_workers = 2;
  write_frame("03-handshake-reply", TS_MSG_HANDSHAKE_REPLY, &hr.base, 0, 0, 0);

  uint64_t s0[] = {784, 256}, s1[] = {256};
  Tessera__TensorDecl t0 = TESSERA__TENSOR_DECL__INIT, t1 = TESSERA__TENSOR_DECL__INIT;
  t0.name = "fc1/weights";
  t0.n_shape = 2;
  t0.shape = s0;
  t0.init = TESSERA__INIT__INIT_GLOROT_UNIFORM;
  t1.name = "fc1/bias";
  t1.n_shape = 1;
  t1.shape = s1;
  t1.init = TESSERA__INIT__INIT_ONES;
  Tessera__TensorDecl *tensors[] = {&t0, &t1};
  Tessera__Declare decl = TESSERA__DECLARE__INIT;
  decl.request_id = 2;
  decl.n_tensors = 2;
  decl.tensors = tensors;
  decl.seed = 42;
  write_frame("04-declare", TS_MSG_DECLARE, &decl.base, 0, 0, 0);

  Tessera__DeclareReply dr = TESSERA__DECLARE_REPLY__INIT;
  dr.request_id = 2;
  dr.created = 1;
  dr.partitions = 3;
  dr.bytes = 803840;
  write_frame("05-declare-reply", TS_MSG_DECLARE_REPLY, &dr.base, 0, 0, 0);

  set_slices(4);
  Tessera__Pull pull = TESSERA__PULL__INIT;
  pull.request_id = 3;
  pull.n_parts = 4;
  pull.parts = slice_ptrs;
  pull.min_version = 3;
  pull.clock = 3;
  pull.timeout_ms = 1000;
  write_frame("06-pull", TS_MSG_PULL, &pull.base, 0, 0, 0);

  Tessera__PullReply preply = TESSERA__PULL_REPLY__INIT;
  preply.request_id = 3;
  preply.n_parts = 4;
  preply.parts = slice_ptrs;
  write_frame("07-pull-reply", TS_MSG_PULL_REPLY, &preply.base, 64, 64, 0);

  Tessera__Push push = TESSERA__PUSH__INIT;
  push.request_id = 4;
  push.n_parts = 2;
  push.parts = slice_ptrs;
  push.step = 3;
  write_frame("08-push", TS_MSG_PUSH, &push.base, 32, 32, 0);
  Tessera__Push push0 = TESSERA__PUSH__INIT;
  push0.request_id = 5;
  push0.step = 4;
  write_frame("08-push-empty", TS_MSG_PUSH, &push0.base, 0, 0, 0);

  Tessera__PushResult results[] = {TESSERA__PUSH_RESULT__PUSH_ACCUMULATED,
                                   TESSERA__PUSH_RESULT__PUSH_STALE};
  Tessera__PushReply pr = TESSERA__PUSH_REPLY__INIT;
  pr.request_id = 4;
  pr.n_results = 2;
  pr.results = results;
  pr.stale_dropped = 1;
  write_frame("09-push-reply", TS_MSG_PUSH_REPLY, &pr.base, 0, 0, 0);

  Tessera__Heartbeat hb = TESSERA__HEARTBEAT__INIT;
  hb.request_id = 6;
  hb.task = 1;
  hb.step = 10;
  hb.loss = 0.75;
  hb.examples_per_sec = 5000.0;
  hb.epoch_progress = 0.125;
  write_frame("10-heartbeat", TS_MSG_HEARTBEAT, &hb.base, 0, 0, 0);

  Tessera__HeartbeatReply hbr = TESSERA__HEARTBEAT_REPLY__INIT;
  hbr.request_id = 6;
  hbr.step = 10;
  write_frame("11-heartbeat-reply", TS_MSG_HEARTBEAT_REPLY, &hbr.base, 0, 0, 0);

  Tessera__Status st = TESSERA__STATUS__INIT;
  st.request_id = 7;
  write_frame("12-status", TS_MSG_STATUS, &st.base, 0, 0, 0);

  Tessera__WorkerStatus w = TESSERA__WORKER_STATUS__INIT;
  w.task = 0;
  w.step = 10;
  w.loss = 0.5;
  w.alive = 1;
  w.identity = "ps-worker task 0";
  w.clock = 10;
  Tessera__WorkerStatus *ws[] = {&w};
  int32_t waiting[] = {1};
  Tessera__ShardStatus ss = TESSERA__SHARD_STATUS__INIT;
  ss.request_id = 7;
  ss.shard = 0;
  ss.num_shards = 2;
  ss.mode = TESSERA__MODE__MODE_SYNC;
  ss.step = 10;
  ss.partitions = 2;
  ss.bytes = 401920;
  ss.n_workers = 1;
  ss.workers = ws;
  ss.uptime_s = 12.5;
  ss.num_workers = 2;
  ss.n_barrier_waiting_for = 1;
  ss.barrier_waiting_for = waiting;
  write_frame("13-status-reply", TS_MSG_STATUS_REPLY, &ss.base, 0, 0, 0);

  Tessera__Error err = TESSERA__ERROR__INIT;
  err.request_id = 8;
  err.code = -30005;
  err.name = "ESIZE";
  err.detail = "push meta describes 32 payload bytes but the frame carries 16";
  write_frame("14-error", TS_MSG_ERROR, &err.base, 0, 0, 0);

  Tessera__Checkpoint ck = TESSERA__CHECKPOINT__INIT;
  ck.request_id = 9;
  write_frame("15-checkpoint", TS_MSG_CHECKPOINT, &ck.base, 0, 0, 0);

  Tessera__CheckpointReply ckr = TESSERA__CHECKPOINT_REPLY__INIT;
  ckr.request_id = 9;
  ckr.path = "/var/lib/tessera/ckpt/shard-0/ckpt-000000000010.tsckpt";
  ckr.step = 10;
  ckr.bytes = 803872;
  ckr.seconds = 0.015625;
  write_frame("16-checkpoint-reply", TS_MSG_CHECKPOINT_REPLY, &ckr.base, 0, 0, 0);

  Tessera__Shutdown sd = TESSERA__SHUTDOWN__INIT;
  sd.request_id = 10;
  sd.checkpoint = 1;
  write_frame("17-shutdown", TS_MSG_SHUTDOWN, &sd.base, 0, 0, 0);

  Tessera__ShutdownReply sdr = TESSERA__SHUTDOWN_REPLY__INIT;
  sdr.request_id = 10;
  sdr.checkpoint_path = "/var/lib/tessera/ckpt/shard-0/ckpt-000000000011.tsckpt";
  write_frame("18-shutdown-reply", TS_MSG_SHUTDOWN_REPLY, &sdr.base, 0, 0, 0);

  Tessera__ModelReset mr = TESSERA__MODEL_RESET__INIT;
  mr.request_id = 11;
  mr.force = 1;
  write_frame("19-model-reset", TS_MSG_MODEL_RESET, &mr.base, 0, 0, 0);

  Tessera__ModelResetReply mrr = TESSERA__MODEL_RESET_REPLY__INIT;
  mrr.request_id = 11;
  mrr.dropped = 1;
  mrr.tensors = 4;
  mrr.bytes = 803872;
  mrr.workers_closed = 2;
  write_frame("19-model-reset-reply", TS_MSG_MODEL_RESET_REPLY, &mrr.base, 0, 0, 0);

  Tessera__TableKeys tk = TESSERA__TABLE_KEYS__INIT;
  tk.request_id = 12;
  tk.cursor = 4096;
  tk.max_keys = 65536;
  write_frame("25-table-keys", TS_MSG_TABLE_KEYS, &tk.base, 0, 0, 0);

  Tessera__TableKeysReply tkr = TESSERA__TABLE_KEYS_REPLY__INIT;
  tkr.request_id = 12;
  tkr.num_keys = 4;
  tkr.next_cursor = 4100;
  tkr.erased = 3;
  tkr.rows = 4;
  write_frame("26-table-keys-reply", TS_MSG_TABLE_KEYS_REPLY, &tkr.base, 32, 32, 0);

  /* Truncated: a header only, and half a meta. */
  write_frame("20-declare-header-only", TS_MSG_DECLARE, &decl.base, 0, 0, TS_FRAME_HEADER_SIZE);
  write_frame("21-declare-half-meta", TS_MSG_DECLARE, &decl.base, 0, 0,
              TS_FRAME_HEADER_SIZE + protobuf_c_message_get_packed_size(&decl.base) / 2);
  write_frame("22-push-short-header", TS_MSG_PUSH, &push.base, 32, 0, 11);

  /* Payload sizes that disagree with the meta. */
  write_frame("30-push-size-mismatch", TS_MSG_PUSH, &push.base, 28, 28, 0);
  write_frame("31-pull-reply-size-mismatch", TS_MSG_PULL_REPLY, &preply.base, 68, 68, 0);
  set_slices(0);
  write_frame("32-push-zero-count", TS_MSG_PUSH, &push.base, 0, 0, 0);
  set_slices((1ull << 62) + 1);
  write_frame("33-push-count-overflow", TS_MSG_PUSH, &push.base, 8, 8, 0);

  /* Declare limits. */
  t1.name = "";
  write_frame("40-declare-empty-name", TS_MSG_DECLARE, &decl.base, 0, 0, 0);
  t1.name = "fc1/bias";
  uint64_t s9[] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  t1.shape = s9;
  t1.n_shape = 9;
  write_frame("41-declare-rank9", TS_MSG_DECLARE, &decl.base, 0, 0, 0);
  uint64_t sover[] = {1ull << 32, 1ull << 31};
  t1.shape = sover;
  t1.n_shape = 2;
  write_frame("42-declare-shape-overflow", TS_MSG_DECLARE, &decl.base, 0, 0, 0);
  t1.shape = s1;
  t1.n_shape = 1;
  t1.init = (Tessera__Init)7;
  write_frame("43-declare-unknown-init", TS_MSG_DECLARE, &decl.base, 0, 0, 0);
}

static void bad_headers(void) {
  write_file("50-empty", (const uint8_t *)"", 0);
  write_file("51-bad-magic", (const uint8_t *)"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27);
  write_raw("52-bad-version", 2, TS_MSG_HELLO, 0, 0, "", 0);
  write_raw("53-type-zero", 1, 0, 0, 0, "", 0);
  write_raw("54-type-count", 1, TS_MSG__COUNT, 0, 0, "", 0);
  write_raw("55-meta-too-big", 1, TS_MSG_DECLARE, TS_FRAME_MAX_META + 1, 0, "", 0);
  write_raw("56-data-on-hello", 1, TS_MSG_HELLO, 0, 4, "", 0);
  write_raw("57-data-not-float", 1, TS_MSG_PUSH, 0, 6, "", 0);
  write_raw("58-data-4gib", 1, TS_MSG_PUSH, 0, 1ull << 32, "", 0);
  write_raw("60-garbage-meta", 1, TS_MSG_PUSH, 6, 0, "\x12\x10\x08\x80\x80\xff", 6);
  write_raw("61-truncated-varint", 1, TS_MSG_HEARTBEAT, 2, 0, "\x08\x80", 2);
  write_raw("62-wire-type-clash", 1, TS_MSG_PUSH, 2, 0, "\x10\x01", 2);
}

/* fuzz_msg only: what the frame header would have refused, and raw metas. */
static void bad_msgs(void) {
  write_msg("50-empty-meta-push-odd-len", TS_MSG_PUSH, 6, NULL, 0);
  write_msg("51-type-zero", 0, 0, NULL, 0);
  write_msg("52-type-count", TS_MSG__COUNT, 0, NULL, 0);
  write_msg("53-data-on-hello", TS_MSG_HELLO, 4, NULL, 0);
  write_msg("54-data-len-max", TS_MSG_PULL_REPLY, UINT64_MAX, NULL, 0);
  write_msg("60-garbage-meta", TS_MSG_PUSH, 0, (const uint8_t *)"\x12\x10\x08\x80\x80\xff", 6);
  write_msg("61-truncated-varint", TS_MSG_HEARTBEAT, 0, (const uint8_t *)"\x08\x80", 2);
  write_msg("62-wire-type-clash", TS_MSG_PUSH, 0, (const uint8_t *)"\x10\x01", 2);
  write_msg("63-shutdown-bool-overlong", TS_MSG_SHUTDOWN, 0,
            (const uint8_t *)"\x08\x01\x10\x81\x80\x80\x80\x00", 8);
  write_msg("64-checkpoint-reply-bad-utf8", TS_MSG_CHECKPOINT_REPLY, 0,
            (const uint8_t *)"\x08\x01\x12\x02\xc3\x28", 6);
  write_msg("65-checkpoint-unknown-field", TS_MSG_CHECKPOINT, 0,
            (const uint8_t *)"\x08\x01\x98\x06\x07", 5);
}

int main(int argc, char **argv) {
  if (argc != 3 || (strcmp(argv[1], "frame") != 0 && strcmp(argv[1], "msg") != 0)) {
    fprintf(stderr, "usage: %s frame|msg OUTDIR\n", argv[0]);
    return 2;
  }
  msg_mode = strcmp(argv[1], "msg") == 0;
  target = argv[1];
  outdir = argv[2];
  valid_frames();
  if (msg_mode)
    bad_msgs();
  else
    bad_headers();
  return failures ? 1 : 0;
}
