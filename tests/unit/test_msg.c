/*
 * Message codec (proto/ts_msg.h): every frame type through ts_msg_encode and back, and
 * allocation failure while decoding. Malformed input, the payload-size check of Push and
 * PullReply, and the Declare limits are in test_msg_invalid.c.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "msg_fixtures.h"

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
 * comes back as the same type of message (Declare, SparsePullReply and SparsePush excepted
 * from the decode: an empty one is refused by its validation, a width of 0). */
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
    if (rows[i].type == TS_MSG_DECLARE || rows[i].type == TS_MSG_SPARSE_PULL_REPLY ||
        rows[i].type == TS_MSG_SPARSE_PUSH)
      continue;
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
  m.push_id = 12;
  m.client_incarnation = UINT64_C(0xfedcba9876543210);
  Tessera__Push *d = (Tessera__Push *)decode_ok(TS_MSG_PUSH, &m.base, 4 * (1 + 2));
  assert_int_equal(d->step, 77);
  assert_int_equal(d->push_id, 12);
  assert_true(d->client_incarnation == UINT64_C(0xfedcba9876543210));
  ts_msg_free(&d->base);
  /* Without an id (an older client): both fields read as 0, "no id". */
  m.push_id = m.client_incarnation = 0;
  d = (Tessera__Push *)decode_ok(TS_MSG_PUSH, &m.base, 4 * (1 + 2));
  assert_int_equal(d->push_id, 0);
  assert_int_equal(d->client_incarnation, 0);
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
      cmocka_unit_test(test_round_trip_hello),
      cmocka_unit_test(test_round_trip_handshake),
      cmocka_unit_test(test_round_trip_declare),
      cmocka_unit_test(test_round_trip_pull),
      cmocka_unit_test(test_round_trip_push),
      cmocka_unit_test(test_round_trip_heartbeat_status_error),
      cmocka_unit_test_setup_teardown(test_alloc_failure, count_allocs_setup,
                                      count_allocs_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
