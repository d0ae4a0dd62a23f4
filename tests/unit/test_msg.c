/*
 * Message codec (proto/ts_msg.h): every frame type through ts_msg_encode and back, the
 * payload-size check of Push and PullReply, the Declare limits, and allocation failure.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_frame.h"
#include "ts_msg.h"

/* Live allocations made through ts_protobuf_allocator (all of a decode's): the test wraps
 * the allocator's functions to count them, so a leak on any path shows as a non-zero
 * balance. LeakSanitizer checks the same in the sanitizer build. */
static long live_allocs;
static ProtobufCAllocator real_allocator;

static void *counting_alloc(void *data, size_t size) {
  void *p = real_allocator.alloc(data, size);
  if (p) live_allocs++;
  return p;
}

static void counting_free(void *data, void *p) {
  if (p) live_allocs--;
  real_allocator.free(data, p);
}

static int count_allocs_setup(void **state) {
  (void)state;
  real_allocator = ts_protobuf_allocator;
  ts_protobuf_allocator.alloc = counting_alloc;
  ts_protobuf_allocator.free = counting_free;
  live_allocs = 0;
  return 0;
}

static int count_allocs_teardown(void **state) {
  (void)state;
  ts_protobuf_allocator = real_allocator;
  return 0;
}

/* One frame: encode msg, decode the header back, then the meta. Returns ts_msg_decode's
 * result; *out as ts_msg_decode leaves it. */
static int frame_round_trip(uint16_t type, const ProtobufCMessage *msg, uint64_t data_len,
                            ProtobufCMessage **out, char *err, size_t errlen) {
  size_t n = ts_msg_frame_size(msg);
  uint8_t *buf = malloc(n);
  assert_non_null(buf);
  assert_int_equal(ts_msg_encode(type, msg, data_len, buf), n);

  ts_frame_header_t h;
  const char *desc = NULL;
  assert_int_equal(ts_frame_decode_header(buf, n, UINT64_MAX - 3, &h, &desc),
                   TS_FRAME_HEADER_SIZE);
  assert_int_equal(h.type, type);
  assert_int_equal(h.meta_len, n - TS_FRAME_HEADER_SIZE);
  assert_true(h.data_len == data_len);

  err[0] = '\0';
  int rc = ts_msg_decode(h.type, buf + TS_FRAME_HEADER_SIZE, h.meta_len, h.data_len, out, err,
                         errlen);
  free(buf);
  return rc;
}

/* Packs of the original and the decoded message are byte-identical: every field survived. */
static void assert_same_packed(const ProtobufCMessage *a, const ProtobufCMessage *b) {
  assert_ptr_equal(a->descriptor, b->descriptor);
  size_t na = protobuf_c_message_get_packed_size(a);
  size_t nb = protobuf_c_message_get_packed_size(b);
  assert_int_equal(na, nb);
  uint8_t *pa = malloc(na + 1), *pb = malloc(nb + 1);
  assert_non_null(pa);
  assert_non_null(pb);
  assert_int_equal(protobuf_c_message_pack(a, pa), na);
  assert_int_equal(protobuf_c_message_pack(b, pb), nb);
  assert_memory_equal(pa, pb, na);
  free(pa);
  free(pb);
}

static ProtobufCMessage *decode_ok(uint16_t type, const ProtobufCMessage *msg, uint64_t data_len) {
  ProtobufCMessage *out = (ProtobufCMessage *)1;
  char err[256];
  int rc = frame_round_trip(type, msg, data_len, &out, err, sizeof err);
  if (rc != 0) print_error("decode of %s failed: %s\n", ts_frame_type_name(type), err);
  assert_int_equal(rc, 0);
  assert_non_null(out);
  assert_ptr_equal(out->descriptor, ts_msg_descriptor(type));
  assert_same_packed(msg, out);
  return out;
}

static int decode_err(uint16_t type, const ProtobufCMessage *msg, uint64_t data_len,
                      char *err, size_t errlen) {
  ProtobufCMessage *out = (ProtobufCMessage *)1;
  int rc = frame_round_trip(type, msg, data_len, &out, err, errlen);
  assert_null(out);
  assert_true(rc < 0);
  assert_true(strlen(err) > 0);
  return rc;
}

/* ---- message builders ---- */

static Tessera__PartSlice slice_store[8];
static Tessera__PartSlice *slice_ptrs[8];

static Tessera__PartSlice **make_slices(size_t n, uint64_t count0) {
  assert_true(n <= 8);
  for (size_t i = 0; i < n; i++) {
    Tessera__PartSlice s = TESSERA__PART_SLICE__INIT;
    s.tensor = (uint32_t)i;
    s.part = (uint32_t)(i * 3 + 1);
    s.count = count0 + i;
    s.version = 100 + i;
    slice_store[i] = s;
    slice_ptrs[i] = &slice_store[i];
  }
  return slice_ptrs;
}

/* ---- round trips ---- */

static void test_descriptors(void **state) {
  (void)state;
  assert_null(ts_msg_descriptor(0));
  assert_null(ts_msg_descriptor(TS_MSG__COUNT));
  assert_null(ts_msg_descriptor(0xffff));
  for (uint16_t t = 1; t < TS_MSG__COUNT; t++) assert_non_null(ts_msg_descriptor(t));
  assert_ptr_equal(ts_msg_descriptor(TS_MSG_STATUS_REPLY), &tessera__shard_status__descriptor);
  assert_ptr_equal(ts_msg_descriptor(TS_MSG_PUSH), &tessera__push__descriptor);
}

/* Every row of TS_FRAME_MAP: the descriptor lookup returns the row's descriptor, and an
 * empty message of it goes through ts_msg_encode, the header decoder and ts_msg_decode and
 * comes back as the same type of message (Declare excepted from the decode: an empty one
 * is refused by its validation, tested below). */
static void test_frame_map_descriptors(void **state) {
  (void)state;
  static const struct {
    uint16_t type;
    const char *name;
    const ProtobufCMessageDescriptor *desc;
  } rows[] = {
#define ROW_(name, value, desc, metrics, dir, data) {value, #name, &desc},
      TS_FRAME_MAP(ROW_)
#undef ROW_
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    assert_ptr_equal(ts_msg_descriptor(rows[i].type), rows[i].desc);
    assert_string_equal(ts_frame_type_name(rows[i].type), rows[i].name);
    if (rows[i].type == TS_MSG_DECLARE) continue;
    uint8_t storage[512] __attribute__((aligned(16)));
    assert_true(rows[i].desc->sizeof_message <= sizeof storage);
    ProtobufCMessage *m = (ProtobufCMessage *)(void *)storage;
    protobuf_c_message_init(rows[i].desc, m);
    uint8_t frame[64];
    assert_true(ts_msg_frame_size(m) <= sizeof frame);
    size_t n = ts_msg_encode(rows[i].type, m, 0, frame);
    ts_frame_header_t h;
    assert_int_equal(ts_frame_decode_header(frame, n, 0, &h, NULL), TS_FRAME_HEADER_SIZE);
    assert_int_equal(h.type, rows[i].type);
    ProtobufCMessage *out = NULL;
    char err[256];
    int rc = ts_msg_decode(h.type, frame + TS_FRAME_HEADER_SIZE, h.meta_len, 0, &out, err,
                           sizeof err);
    if (rc != 0) print_error("decode of %s failed: %s\n", rows[i].name, err);
    assert_int_equal(rc, 0);
    assert_ptr_equal(out->descriptor, rows[i].desc);
    ts_msg_free(out);
  }
}

static void test_round_trip_hello(void **state) {
  (void)state;
  uint8_t nonce[32];
  for (int i = 0; i < 32; i++) nonce[i] = (uint8_t)(i * 7 + 1);
  Tessera__Hello m = TESSERA__HELLO__INIT;
  m.protocol = TS_PROTOCOL_VERSION;
  m.shard = 1;
  m.num_shards = 2;
  m.nonce.data = nonce;
  m.nonce.len = sizeof nonce;
  m.server_id = "ps-server/0.1.0 shard 1";
  Tessera__Hello *d = (Tessera__Hello *)decode_ok(TS_MSG_HELLO, &m.base, 0);
  assert_int_equal(d->num_shards, 2);
  assert_int_equal(d->nonce.len, 32);
  assert_memory_equal(d->nonce.data, nonce, 32);
  assert_string_equal(d->server_id, m.server_id);
  ts_msg_free(&d->base);

  /* All defaults: an empty meta. */
  Tessera__Hello e = TESSERA__HELLO__INIT;
  assert_int_equal(protobuf_c_message_get_packed_size(&e.base), 0);
  ts_msg_free(decode_ok(TS_MSG_HELLO, &e.base, 0));
}

static void test_round_trip_handshake(void **state) {
  (void)state;
  uint8_t mac[32] = {1, 2, 3};
  Tessera__Handshake m = TESSERA__HANDSHAKE__INIT;
  m.request_id = UINT64_MAX;
  m.protocol = 1;
  m.role = TESSERA__ROLE__ROLE_ADMIN;
  m.task = -1;
  m.identity = "psctl pid 42@host";
  m.mac.data = mac;
  m.mac.len = sizeof mac;
  Tessera__Handshake *d = (Tessera__Handshake *)decode_ok(TS_MSG_HANDSHAKE, &m.base, 0);
  assert_true(d->request_id == UINT64_MAX);
  assert_int_equal(d->task, -1);
  assert_int_equal(d->role, TESSERA__ROLE__ROLE_ADMIN);
  ts_msg_free(&d->base);

  Tessera__HandshakeReply r = TESSERA__HANDSHAKE_REPLY__INIT;
  r.request_id = 7;
  r.shard = 3;
  r.num_shards = 4;
  r.mode = TESSERA__MODE__MODE_SSP;
  r.partition_bytes = 4194304;
  r.num_workers = 9;
  Tessera__HandshakeReply *dr =
      (Tessera__HandshakeReply *)decode_ok(TS_MSG_HANDSHAKE_REPLY, &r.base, 0);
  assert_int_equal(dr->partition_bytes, 4194304);
  assert_int_equal(dr->mode, TESSERA__MODE__MODE_SSP);
  ts_msg_free(&dr->base);
}

static void test_round_trip_declare(void **state) {
  (void)state;
  uint64_t s0[] = {784, 256}, s1[] = {256}, s2[] = {2, 3, 4, 5, 6, 7, 8, 9};
  Tessera__TensorDecl t0 = TESSERA__TENSOR_DECL__INIT, t1 = TESSERA__TENSOR_DECL__INIT,
                      t2 = TESSERA__TENSOR_DECL__INIT;
  t0.name = "fc1/weights";
  t0.n_shape = 2;
  t0.shape = s0;
  t0.init = TESSERA__INIT__INIT_GLOROT_UNIFORM;
  t1.name = "fc1/bias";
  t1.n_shape = 1;
  t1.shape = s1;
  t1.init = TESSERA__INIT__INIT_ZEROS;
  t2.name = "rank8";
  t2.n_shape = 8;
  t2.shape = s2;
  t2.init = TESSERA__INIT__INIT_ONES;
  Tessera__TensorDecl *ts[] = {&t0, &t1, &t2};
  Tessera__Declare m = TESSERA__DECLARE__INIT;
  m.request_id = 1;
  m.n_tensors = 3;
  m.tensors = ts;
  m.seed = 42;
  Tessera__Declare *d = (Tessera__Declare *)decode_ok(TS_MSG_DECLARE, &m.base, 0);
  assert_int_equal(d->n_tensors, 3);
  assert_string_equal(d->tensors[0]->name, "fc1/weights");
  assert_int_equal(d->tensors[0]->shape[0], 784);
  assert_int_equal(d->tensors[2]->n_shape, 8);
  assert_int_equal(d->seed, 42);
  ts_msg_free(&d->base);

  Tessera__DeclareReply r = TESSERA__DECLARE_REPLY__INIT;
  r.request_id = 1;
  r.created = 1;
  r.partitions = 5;
  r.bytes = 1ull << 40;
  r.version = 3;
  Tessera__DeclareReply *dr = (Tessera__DeclareReply *)decode_ok(TS_MSG_DECLARE_REPLY, &r.base, 0);
  assert_true(dr->created);
  assert_true(dr->bytes == 1ull << 40);
  ts_msg_free(&dr->base);
}

static void test_round_trip_pull(void **state) {
  (void)state;
  Tessera__Pull m = TESSERA__PULL__INIT;
  m.request_id = 5;
  m.n_parts = 3;
  m.parts = make_slices(3, 1000);
  m.min_version = 17;
  m.clock = 18;
  m.timeout_ms = 30000;
  /* A Pull carries no payload whatever its slices say. */
  Tessera__Pull *d = (Tessera__Pull *)decode_ok(TS_MSG_PULL, &m.base, 0);
  assert_int_equal(d->n_parts, 3);
  assert_int_equal(d->parts[2]->count, 1002);
  assert_int_equal(d->timeout_ms, 30000);
  ts_msg_free(&d->base);

  /* Payload of PullReply: 4 bytes per value, in slice order. */
  Tessera__PullReply r = TESSERA__PULL_REPLY__INIT;
  r.request_id = 5;
  r.n_parts = 3;
  r.parts = make_slices(3, 1000);
  Tessera__PullReply *dr =
      (Tessera__PullReply *)decode_ok(TS_MSG_PULL_REPLY, &r.base, 4 * (1000 + 1001 + 1002));
  assert_int_equal(dr->parts[1]->version, 101);
  ts_msg_free(&dr->base);

  /* An empty reply carries an empty payload. */
  Tessera__PullReply e = TESSERA__PULL_REPLY__INIT;
  ts_msg_free(decode_ok(TS_MSG_PULL_REPLY, &e.base, 0));
}

static void test_round_trip_push(void **state) {
  (void)state;
  Tessera__Push m = TESSERA__PUSH__INIT;
  m.request_id = 9;
  m.n_parts = 2;
  m.parts = make_slices(2, 1);
  m.step = 77;
  Tessera__Push *d = (Tessera__Push *)decode_ok(TS_MSG_PUSH, &m.base, 4 * (1 + 2));
  assert_int_equal(d->step, 77);
  ts_msg_free(&d->base);

  /* A Push with no partitions only advances the clock. */
  Tessera__Push e = TESSERA__PUSH__INIT;
  e.step = 3;
  ts_msg_free(decode_ok(TS_MSG_PUSH, &e.base, 0));

  Tessera__PushResult results[] = {TESSERA__PUSH_RESULT__PUSH_APPLIED,
                                   TESSERA__PUSH_RESULT__PUSH_ACCUMULATED,
                                   TESSERA__PUSH_RESULT__PUSH_STALE,
                                   TESSERA__PUSH_RESULT__PUSH_DUPLICATE};
  Tessera__PushReply r = TESSERA__PUSH_REPLY__INIT;
  r.request_id = 9;
  r.n_results = 4;
  r.results = results;
  r.stale_dropped = 1;
  Tessera__PushReply *dr = (Tessera__PushReply *)decode_ok(TS_MSG_PUSH_REPLY, &r.base, 0);
  assert_int_equal(dr->n_results, 4);
  assert_int_equal(dr->results[3], TESSERA__PUSH_RESULT__PUSH_DUPLICATE);
  ts_msg_free(&dr->base);
}

static void test_round_trip_heartbeat_status_error(void **state) {
  (void)state;
  Tessera__Heartbeat hb = TESSERA__HEARTBEAT__INIT;
  hb.request_id = 11;
  hb.task = 3;
  hb.step = 1234;
  hb.loss = 0.25;
  hb.examples_per_sec = 1e6;
  hb.epoch_progress = 0.5;
  hb.done = 1;
  Tessera__Heartbeat *dhb = (Tessera__Heartbeat *)decode_ok(TS_MSG_HEARTBEAT, &hb.base, 0);
  assert_true(dhb->loss == 0.25);
  assert_true(dhb->done);
  ts_msg_free(&dhb->base);

  Tessera__HeartbeatReply hr = TESSERA__HEARTBEAT_REPLY__INIT;
  hr.request_id = 11;
  hr.step = 1235;
  ts_msg_free(decode_ok(TS_MSG_HEARTBEAT_REPLY, &hr.base, 0));

  Tessera__Status st = TESSERA__STATUS__INIT;
  st.request_id = 12;
  ts_msg_free(decode_ok(TS_MSG_STATUS, &st.base, 0));

  Tessera__WorkerStatus w0 = TESSERA__WORKER_STATUS__INIT, w1 = TESSERA__WORKER_STATUS__INIT;
  w0.task = 0;
  w0.step = 10;
  w0.loss = 1.5;
  w0.alive = 1;
  w0.identity = "ps-worker task 0";
  w0.clock = 10;
  w1.task = 1;
  w1.done = 1;
  w1.last_seen_s = 3.25;
  w1.epoch_progress = 1.0;
  Tessera__WorkerStatus *ws[] = {&w0, &w1};
  int32_t waiting[] = {1, -1, 7};
  Tessera__ShardStatus ss = TESSERA__SHARD_STATUS__INIT;
  ss.request_id = 12;
  ss.shard = 1;
  ss.num_shards = 2;
  ss.mode = TESSERA__MODE__MODE_SYNC;
  ss.step = 10;
  ss.partitions = 4;
  ss.bytes = 1 << 20;
  ss.tensors = 4;
  ss.n_workers = 2;
  ss.workers = ws;
  ss.pushes = 20;
  ss.pulls = 21;
  ss.stale_dropped = 1;
  ss.rejected_frames = 2;
  ss.errors = 3;
  ss.uptime_s = 99.5;
  ss.num_workers = 2;
  ss.n_barrier_waiting_for = 3;
  ss.barrier_waiting_for = waiting;
  ss.connections = 5;
  Tessera__ShardStatus *dss =
      (Tessera__ShardStatus *)decode_ok(TS_MSG_STATUS_REPLY, &ss.base, 0);
  assert_int_equal(dss->n_workers, 2);
  assert_string_equal(dss->workers[0]->identity, "ps-worker task 0");
  assert_int_equal(dss->barrier_waiting_for[1], -1);
  ts_msg_free(&dss->base);

  Tessera__Error e = TESSERA__ERROR__INIT;
  e.request_id = 13;
  e.code = TS_ESIZE;
  e.name = "ESIZE";
  e.detail = "push meta describes 8 payload bytes but the frame carries 4";
  Tessera__Error *de = (Tessera__Error *)decode_ok(TS_MSG_ERROR, &e.base, 0);
  assert_int_equal(de->code, TS_ESIZE);
  assert_string_equal(de->name, "ESIZE");
  ts_msg_free(&de->base);
}

/* ---- malformed input ---- */

static void test_invalid_args(void **state) {
  (void)state;
  ProtobufCMessage *out = (ProtobufCMessage *)1;
  char err[128] = "";
  assert_int_equal(ts_msg_decode(0, NULL, 0, 0, &out, err, sizeof err), TS_EPROTO);
  assert_null(out);
  assert_non_null(strstr(err, "unknown frame type"));
  out = (ProtobufCMessage *)1;
  assert_int_equal(ts_msg_decode(TS_MSG__COUNT, NULL, 0, 0, &out, err, sizeof err), TS_EPROTO);
  assert_null(out);
  static uint8_t big[TS_FRAME_MAX_META + 1];
  out = (ProtobufCMessage *)1;
  assert_int_equal(ts_msg_decode(TS_MSG_HELLO, big, sizeof big, 0, &out, err, sizeof err),
                   TS_ETOOBIG);
  assert_null(out);
  /* A meta of exactly 1 MiB is allowed (zeros are not valid protobuf though: field 0). */
  out = (ProtobufCMessage *)1;
  assert_int_equal(ts_msg_decode(TS_MSG_HELLO, big, TS_FRAME_MAX_META, 0, &out, err, sizeof err),
                   TS_EPROTO);
  assert_null(out);
  /* An empty meta is every field at its default. */
  assert_int_equal(ts_msg_decode(TS_MSG_STATUS, NULL, 0, 0, &out, err, sizeof err), 0);
  assert_non_null(out);
  ts_msg_free(out);
  ts_msg_free(NULL);
}

static void test_garbage_meta(void **state) {
  (void)state;
  static const struct {
    const char *bytes;
    size_t len;
  } cases[] = {
      {"\x08", 1},                   /* varint field with no value */
      {"\x08\x80", 2},               /* truncated varint */
      {"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 12}, /* varint over 10 bytes */
      {"\x12\x10\x08", 3},           /* length-delimited field longer than the meta */
      {"\x00", 1},                   /* field number 0 */
      {"\x0f", 1},                   /* wire type 7 */
      {"\x12\x03\x08\x80\x80", 5},   /* a slice whose varint runs off its end */
      {"GET / HTTP/1.1\r\n", 16},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    for (uint16_t type = 1; type < TS_MSG__COUNT; type++) {
      ProtobufCMessage *out = (ProtobufCMessage *)1;
      char err[256] = "";
      int rc = ts_msg_decode(type, (const uint8_t *)cases[c].bytes, cases[c].len, 0, &out, err,
                             sizeof err);
      if (rc == 0) {
        /* Some bytes parse as some type (unknown fields are skipped): fine, but only then. */
        assert_non_null(out);
        ts_msg_free(out);
        continue;
      }
      assert_null(out);
      assert_true(rc == TS_EPROTO || rc == TS_ESIZE);
      assert_true(strlen(err) > 0);
      if (c < 7) {
        assert_int_equal(rc, TS_EPROTO);
        assert_non_null(strstr(err, "malformed"));
        assert_non_null(strstr(err, ts_frame_type_name(type)));
      }
    }
  }
  /* A well-formed message of another type can still be decoded as this one, but a wire
   * type clash on a known field cannot: field 2 of a Push is a message, not a varint. */
  ProtobufCMessage *out = NULL;
  char err[256];
  assert_int_equal(ts_msg_decode(TS_MSG_PUSH, (const uint8_t *)"\x10\x01", 2, 0, &out, err,
                                 sizeof err),
                   TS_EPROTO);
  assert_null(out);
}

static void test_payload_size_mismatch(void **state) {
  (void)state;
  char err[256];
  Tessera__Push p = TESSERA__PUSH__INIT;
  p.n_parts = 2;
  p.parts = make_slices(2, 10); /* 10 + 11 values = 84 bytes */
  const uint64_t wrong[] = {0, 4, 80, 88, 84 + (1ull << 32)};
  for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
    assert_int_equal(decode_err(TS_MSG_PUSH, &p.base, wrong[i], err, sizeof err), TS_ESIZE);
    assert_non_null(strstr(err, "84"));
  }
  ts_msg_free(decode_ok(TS_MSG_PUSH, &p.base, 84));

  Tessera__PullReply r = TESSERA__PULL_REPLY__INIT;
  r.n_parts = 1;
  r.parts = make_slices(1, 5);
  assert_int_equal(decode_err(TS_MSG_PULL_REPLY, &r.base, 16, err, sizeof err), TS_ESIZE);
  assert_int_equal(decode_err(TS_MSG_PULL_REPLY, &r.base, 24, err, sizeof err), TS_ESIZE);
  ts_msg_free(decode_ok(TS_MSG_PULL_REPLY, &r.base, 20));

  /* An empty Push with a payload. */
  Tessera__Push e = TESSERA__PUSH__INIT;
  assert_int_equal(decode_err(TS_MSG_PUSH, &e.base, 4, err, sizeof err), TS_ESIZE);
}

static void test_parts_bytes_overflow(void **state) {
  (void)state;
  Tessera__PartSlice a = TESSERA__PART_SLICE__INIT, b = TESSERA__PART_SLICE__INIT;
  Tessera__PartSlice *v[] = {&a, &b};
  assert_true(ts_msg_parts_bytes(v, 0) == 0);
  assert_true(ts_msg_parts_bytes(NULL, 0) == 0);

  a.count = UINT64_MAX / 4; /* the largest count whose bytes fit */
  assert_true(ts_msg_parts_bytes(v, 1) == (UINT64_MAX / 4) * 4);
  a.count = UINT64_MAX / 4 + 1;
  assert_true(ts_msg_parts_bytes(v, 1) == UINT64_MAX);
  a.count = UINT64_MAX;
  assert_true(ts_msg_parts_bytes(v, 1) == UINT64_MAX);

  /* Each fits, the sum does not. */
  a.count = UINT64_MAX / 8 + 1;
  b.count = UINT64_MAX / 8 + 1;
  assert_true(ts_msg_parts_bytes(v, 1) == (UINT64_MAX / 8 + 1) * 4);
  assert_true(ts_msg_parts_bytes(v, 2) == UINT64_MAX);
  /* The sum just fits. */
  a.count = UINT64_MAX / 8;
  b.count = UINT64_MAX / 8;
  assert_true(ts_msg_parts_bytes(v, 2) == (UINT64_MAX / 8) * 8);

  /* Overflowing counts never match a payload, not even one of UINT64_MAX bytes: the
   * overflow marker must not pass for a size. */
  char err[256];
  a.count = UINT64_MAX / 4 + 1;
  Tessera__Push p = TESSERA__PUSH__INIT;
  p.n_parts = 1;
  p.parts = v;
  static const uint64_t lens[] = {0, 4, UINT64_MAX - 3, UINT64_MAX};
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
    size_t n = ts_msg_frame_size(&p.base);
    uint8_t *buf = malloc(n);
    assert_non_null(buf);
    ts_msg_encode(TS_MSG_PUSH, &p.base, lens[i], buf);
    ProtobufCMessage *out = (ProtobufCMessage *)1;
    int rc = ts_msg_decode(TS_MSG_PUSH, buf + TS_FRAME_HEADER_SIZE, n - TS_FRAME_HEADER_SIZE,
                           lens[i], &out, err, sizeof err);
    free(buf);
    assert_int_equal(rc, TS_ESIZE);
    assert_null(out);
  }
}

static void test_zero_count(void **state) {
  (void)state;
  char err[256];
  Tessera__Push p = TESSERA__PUSH__INIT;
  p.n_parts = 3;
  p.parts = make_slices(3, 4);
  p.parts[1]->count = 0;
  assert_int_equal(decode_err(TS_MSG_PUSH, &p.base, 4 * (4 + 6), err, sizeof err), TS_EPROTO);
  assert_non_null(strstr(err, "count 0"));
  Tessera__PullReply r = TESSERA__PULL_REPLY__INIT;
  r.n_parts = 1;
  r.parts = make_slices(1, 0);
  assert_int_equal(decode_err(TS_MSG_PULL_REPLY, &r.base, 0, err, sizeof err), TS_EPROTO);
  assert_non_null(strstr(err, "count 0"));
}

/* A Push, PullReply or Pull with TS_MSG_MAX_PARTS slices decodes; one more does not. */
static void test_too_many_parts(void **state) {
  (void)state;
  size_t n = TS_MSG_MAX_PARTS + 1;
  Tessera__PartSlice *store = calloc(n, sizeof *store);
  Tessera__PartSlice **ptrs = calloc(n, sizeof *ptrs);
  assert_non_null(store);
  assert_non_null(ptrs);
  for (size_t i = 0; i < n; i++) {
    Tessera__PartSlice s = TESSERA__PART_SLICE__INIT;
    s.count = 1;
    store[i] = s;
    ptrs[i] = &store[i];
  }
  char err[256];
  Tessera__Push p = TESSERA__PUSH__INIT;
  p.parts = ptrs;
  p.n_parts = TS_MSG_MAX_PARTS;
  ts_msg_free(decode_ok(TS_MSG_PUSH, &p.base, 4ull * TS_MSG_MAX_PARTS));
  p.n_parts = n;
  assert_int_equal(decode_err(TS_MSG_PUSH, &p.base, 4ull * n, err, sizeof err), TS_EPROTO);
  assert_non_null(strstr(err, "65537"));

  Tessera__PullReply r = TESSERA__PULL_REPLY__INIT;
  r.parts = ptrs;
  r.n_parts = n;
  assert_int_equal(decode_err(TS_MSG_PULL_REPLY, &r.base, 4ull * n, err, sizeof err), TS_EPROTO);

  Tessera__Pull q = TESSERA__PULL__INIT;
  q.parts = ptrs;
  q.n_parts = TS_MSG_MAX_PARTS;
  ts_msg_free(decode_ok(TS_MSG_PULL, &q.base, 0));
  q.n_parts = n;
  assert_int_equal(decode_err(TS_MSG_PULL, &q.base, 0, err, sizeof err), TS_EPROTO);
  assert_non_null(strstr(err, "65537"));
  free(ptrs);
  free(store);
}

/* ---- Declare validation ---- */

typedef struct {
  Tessera__TensorDecl decl;
  Tessera__TensorDecl *ptr;
  Tessera__Declare msg;
  uint64_t shape[TS_MSG_MAX_RANK + 2];
} one_decl_t;

static Tessera__Declare *one_decl(one_decl_t *d, const char *name, const uint64_t *shape,
                                  size_t rank, int init) {
  Tessera__TensorDecl t = TESSERA__TENSOR_DECL__INIT;
  Tessera__Declare m = TESSERA__DECLARE__INIT;
  assert_true(rank <= TS_MSG_MAX_RANK + 2);
  if (rank) memcpy(d->shape, shape, rank * sizeof *shape);
  d->decl = t;
  d->decl.name = (char *)name;
  d->decl.shape = d->shape;
  d->decl.n_shape = rank;
  d->decl.init = (Tessera__Init)init;
  d->ptr = &d->decl;
  d->msg = m;
  d->msg.n_tensors = 1;
  d->msg.tensors = &d->ptr;
  d->msg.seed = 1;
  return &d->msg;
}

static void expect_declare_error(Tessera__Declare *m, const char *needle) {
  char err[256];
  assert_int_equal(decode_err(TS_MSG_DECLARE, &m->base, 0, err, sizeof err), TS_EPROTO);
  if (!strstr(err, needle)) fail_msg("error '%s' does not mention '%s'", err, needle);
}

static void test_declare_validation(void **state) {
  (void)state;
  one_decl_t d;
  const uint64_t s2[] = {3, 4};
  ts_msg_free(decode_ok(TS_MSG_DECLARE, &one_decl(&d, "w", s2, 2, 1)->base, 0));

  /* No tensors at all. */
  Tessera__Declare empty = TESSERA__DECLARE__INIT;
  expect_declare_error(&empty, "0 tensors");

  expect_declare_error(one_decl(&d, "", s2, 2, 0), "name of 0 bytes");
  char name[TS_MSG_MAX_NAME + 2];
  memset(name, 'n', sizeof name);
  name[TS_MSG_MAX_NAME] = '\0';
  ts_msg_free(decode_ok(TS_MSG_DECLARE, &one_decl(&d, name, s2, 2, 0)->base, 0));
  name[TS_MSG_MAX_NAME] = 'n';
  name[TS_MSG_MAX_NAME + 1] = '\0';
  expect_declare_error(one_decl(&d, name, s2, 2, 0), "name of 257 bytes");

  const uint64_t ones[TS_MSG_MAX_RANK + 1] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  expect_declare_error(one_decl(&d, "r0", NULL, 0, 0), "rank 0");
  ts_msg_free(decode_ok(TS_MSG_DECLARE, &one_decl(&d, "r8", ones, 8, 0)->base, 0));
  expect_declare_error(one_decl(&d, "r9", ones, 9, 0), "rank 9");

  const uint64_t zero_dim[] = {3, 0, 4};
  expect_declare_error(one_decl(&d, "z", zero_dim, 3, 0), "empty or oversized");

  /* The byte size must fit in 64 bits: 2^61 elements (2^63 bytes) do, 2^62 do not. */
  const uint64_t fits[] = {1ull << 31, 1ull << 30};
  ts_msg_free(decode_ok(TS_MSG_DECLARE, &one_decl(&d, "big", fits, 2, 0)->base, 0));
  const uint64_t over[] = {1ull << 32, 1ull << 30};
  expect_declare_error(one_decl(&d, "over", over, 2, 0), "empty or oversized");
  const uint64_t over1[] = {1ull << 62};
  expect_declare_error(one_decl(&d, "over1", over1, 1, 0), "empty or oversized");
  const uint64_t wrap[] = {1ull << 32, 1ull << 32, 4}; /* 2^64 * 4 wraps to 0 */
  expect_declare_error(one_decl(&d, "wrap", wrap, 3, 0), "empty or oversized");
  const uint64_t huge[] = {UINT64_MAX, UINT64_MAX};
  expect_declare_error(one_decl(&d, "huge", huge, 2, 0), "empty or oversized");

  expect_declare_error(one_decl(&d, "i3", s2, 2, 3), "unknown initializer 3");
  expect_declare_error(one_decl(&d, "im", s2, 2, -1), "unknown initializer -1");

  /* One bad tensor among good ones is found. */
  Tessera__TensorDecl good = TESSERA__TENSOR_DECL__INIT;
  good.name = "good";
  good.n_shape = 2;
  good.shape = (uint64_t *)s2;
  one_decl(&d, "bad", zero_dim, 3, 0);
  Tessera__TensorDecl *both[] = {&good, &d.decl};
  d.msg.n_tensors = 2;
  d.msg.tensors = both;
  expect_declare_error(&d.msg, "'bad'");
}

/* ---- allocation failure ---- */

/* Make each allocation of a decode fail in turn: each attempt fails cleanly (an error, no
 * message, nothing leaked) until enough allocations succeed. */
static void decode_under_alloc_failure(uint16_t type, const ProtobufCMessage *msg,
                                       uint64_t data_len) {
  size_t n = ts_msg_frame_size(msg);
  uint8_t *buf = malloc(n);
  assert_non_null(buf);
  ts_msg_encode(type, msg, data_len, buf);
  const uint8_t *meta = buf + TS_FRAME_HEADER_SIZE;
  size_t meta_len = n - TS_FRAME_HEADER_SIZE;
  char err[256];

  long failures = 0;
  for (long k = 1; k < 10000; k++) {
    long before = live_allocs;
    ProtobufCMessage *out = (ProtobufCMessage *)1;
    err[0] = '\0';
    ts_alloc_fail_after(k);
    int rc = ts_msg_decode(type, meta, meta_len, data_len, &out, err, sizeof err);
    ts_alloc_fail_after(0);
    if (rc == 0) {
      assert_non_null(out);
      assert_same_packed(msg, out);
      assert_true(live_allocs > before);
      ts_msg_free(out);
      assert_int_equal(live_allocs, before);
      break;
    }
    failures++;
    assert_true(rc < 0);
    assert_null(out);
    assert_true(strlen(err) > 0);
    assert_int_equal(live_allocs, before);
  }
  free(buf);
  /* Decoding these messages allocates more than once: every one of those was exercised. */
  assert_true(failures >= 2);
}

static void test_alloc_failure(void **state) {
  (void)state;
  uint64_t s0[] = {784, 256}, s1[] = {256};
  Tessera__TensorDecl t0 = TESSERA__TENSOR_DECL__INIT, t1 = TESSERA__TENSOR_DECL__INIT;
  t0.name = "fc1/weights";
  t0.n_shape = 2;
  t0.shape = s0;
  t1.name = "fc1/bias";
  t1.n_shape = 1;
  t1.shape = s1;
  Tessera__TensorDecl *ts[] = {&t0, &t1};
  Tessera__Declare m = TESSERA__DECLARE__INIT;
  m.n_tensors = 2;
  m.tensors = ts;
  decode_under_alloc_failure(TS_MSG_DECLARE, &m.base, 0);

  Tessera__Push p = TESSERA__PUSH__INIT;
  p.n_parts = 4;
  p.parts = make_slices(4, 2);
  decode_under_alloc_failure(TS_MSG_PUSH, &p.base, 4 * (2 + 3 + 4 + 5));

  Tessera__WorkerStatus w0 = TESSERA__WORKER_STATUS__INIT, w1 = TESSERA__WORKER_STATUS__INIT;
  w0.identity = "a";
  w1.identity = "b";
  Tessera__WorkerStatus *ws[] = {&w0, &w1};
  int32_t waiting[] = {0, 1};
  Tessera__ShardStatus ss = TESSERA__SHARD_STATUS__INIT;
  ss.n_workers = 2;
  ss.workers = ws;
  ss.n_barrier_waiting_for = 2;
  ss.barrier_waiting_for = waiting;
  decode_under_alloc_failure(TS_MSG_STATUS_REPLY, &ss.base, 0);

  Tessera__Error e = TESSERA__ERROR__INIT;
  e.name = "EPROTO";
  e.detail = "detail";
  decode_under_alloc_failure(TS_MSG_ERROR, &e.base, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_descriptors),
      cmocka_unit_test(test_frame_map_descriptors),
      cmocka_unit_test(test_invalid_args),
      cmocka_unit_test(test_round_trip_hello),
      cmocka_unit_test(test_round_trip_handshake),
      cmocka_unit_test(test_round_trip_declare),
      cmocka_unit_test(test_round_trip_pull),
      cmocka_unit_test(test_round_trip_push),
      cmocka_unit_test(test_round_trip_heartbeat_status_error),
      cmocka_unit_test(test_garbage_meta),
      cmocka_unit_test(test_payload_size_mismatch),
      cmocka_unit_test(test_parts_bytes_overflow),
      cmocka_unit_test(test_zero_count),
      cmocka_unit_test(test_too_many_parts),
      cmocka_unit_test(test_declare_validation),
      cmocka_unit_test_setup_teardown(test_alloc_failure, count_allocs_setup,
                                      count_allocs_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
