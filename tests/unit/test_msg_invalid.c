/*
 * Message codec (proto/ts_msg.h), input it refuses: bad arguments, malformed meta for
 * every frame type, the payload-size check of Push and PullReply (and its overflow), zero
 * counts, too many partitions, and the Declare limits. Round trips and allocation failure
 * are in test_msg.c.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "msg_fixtures.h"

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

  /* A TableKeysReply: 8 bytes a key, at most 2^20 keys. */
  Tessera__TableKeysReply k = TESSERA__TABLE_KEYS_REPLY__INIT;
  k.num_keys = 3;
  assert_int_equal(decode_err(TS_MSG_TABLE_KEYS_REPLY, &k.base, 12, err, sizeof err), TS_ESIZE);
  assert_int_equal(decode_err(TS_MSG_TABLE_KEYS_REPLY, &k.base, 32, err, sizeof err), TS_ESIZE);
  ts_msg_free(decode_ok(TS_MSG_TABLE_KEYS_REPLY, &k.base, 24));
  k.num_keys = TS_MSG_MAX_KEYS + 1;
  assert_int_equal(decode_err(TS_MSG_TABLE_KEYS_REPLY, &k.base, 8 * k.num_keys, err, sizeof err),
                   TS_EPROTO);

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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_invalid_args),
      cmocka_unit_test(test_garbage_meta),
      cmocka_unit_test(test_payload_size_mismatch),
      cmocka_unit_test(test_parts_bytes_overflow),
      cmocka_unit_test(test_zero_count),
      cmocka_unit_test(test_too_many_parts),
      cmocka_unit_test(test_declare_validation),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
