/*
 * Frame header codec (proto/ts_frame.h): every limit and boundary of
 * ts_frame_decode_header, and the encode/decode round trip.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "ts_err.h"
#include "ts_frame.h"

#define MAX_DATA (1ull << 30)

/* A header with explicit fields, so tests can write values the encoder never would. */
static void put_header(uint8_t *dst, const char *magic, uint16_t version, uint16_t type,
                       uint32_t meta_len, uint64_t data_len) {
  ts_frame_encode_header(dst, type, meta_len, data_len);
  memcpy(dst, magic, 4);
  dst[4] = (uint8_t)version;
  dst[5] = (uint8_t)(version >> 8);
}

static int decode(const uint8_t *src, size_t len, uint64_t max_data, ts_frame_header_t *out,
                  const char **desc) {
  *desc = NULL;
  return ts_frame_decode_header(src, len, max_data, out, desc);
}

/* Every length short of a full header asks for more bytes and touches neither output. */
static void test_short_lengths_incomplete(void **state) {
  (void)state;
  uint8_t buf[TS_FRAME_HEADER_SIZE];
  ts_frame_encode_header(buf, TS_MSG_PUSH, 10, 64);
  for (size_t len = 0; len < TS_FRAME_HEADER_SIZE; len++) {
    ts_frame_header_t h = {.version = 0xabcd, .type = 0xabcd, .meta_len = 7, .data_len = 9};
    const char *desc = NULL;
    int rc = decode(buf, len, MAX_DATA, &h, &desc);
    assert_int_equal(rc, TS_EINCOMPLETE);
    assert_null(desc);
    assert_int_equal(h.version, 0xabcd);
    assert_int_equal(h.meta_len, 7);
  }
  ts_frame_header_t h;
  const char *desc;
  assert_int_equal(decode(buf, TS_FRAME_HEADER_SIZE, MAX_DATA, &h, &desc), TS_FRAME_HEADER_SIZE);
  /* An empty buffer may be NULL. */
  assert_int_equal(decode(NULL, 0, MAX_DATA, &h, &desc), TS_EINCOMPLETE);
}

/* The magic is checked on whatever prefix has arrived, so garbage is refused at once. */
static void test_bad_magic_on_prefix(void **state) {
  (void)state;
  static const char *const bad[] = {"XSR1", "TXR1", "TSX1", "TSRX", "tsr1", "\0\0\0\0"};
  for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
    uint8_t buf[TS_FRAME_HEADER_SIZE];
    put_header(buf, bad[b], TS_PROTOCOL_VERSION, TS_MSG_HELLO, 0, 0);
    /* The first wrong byte is at index i: every prefix that includes it is refused, every
     * shorter one is incomplete. */
    size_t i = 0;
    while (i < 4 && buf[i] == (uint8_t)TS_FRAME_MAGIC[i]) i++;
    assert_true(i < 4);
    for (size_t len = 1; len <= TS_FRAME_HEADER_SIZE; len++) {
      ts_frame_header_t h;
      const char *desc;
      int rc = decode(buf, len, MAX_DATA, &h, &desc);
      if (len <= i) {
        assert_int_equal(rc, TS_EINCOMPLETE);
      } else {
        assert_int_equal(rc, TS_EPROTO);
        assert_non_null(desc);
        assert_non_null(strstr(desc, "magic"));
      }
    }
  }
  /* Explicitly: 1, 2 and 3 bytes of garbage are enough. */
  const uint8_t garbage[3] = {'G', 'E', 'T'};
  for (size_t len = 1; len <= 3; len++) {
    ts_frame_header_t h;
    const char *desc;
    assert_int_equal(decode(garbage, len, MAX_DATA, &h, &desc), TS_EPROTO);
  }
  /* A good prefix of 1..3 bytes is just incomplete. */
  for (size_t len = 1; len <= 3; len++) {
    ts_frame_header_t h;
    const char *desc;
    assert_int_equal(decode((const uint8_t *)"TSR", len, MAX_DATA, &h, &desc), TS_EINCOMPLETE);
  }
}

static void test_wrong_version(void **state) {
  (void)state;
  static const uint16_t versions[] = {0, 2, 0x0100, 0xffff};
  for (size_t v = 0; v < sizeof versions / sizeof versions[0]; v++) {
    uint8_t buf[TS_FRAME_HEADER_SIZE];
    put_header(buf, TS_FRAME_MAGIC, versions[v], TS_MSG_HELLO, 0, 0);
    ts_frame_header_t h;
    const char *desc;
    assert_int_equal(decode(buf, sizeof buf, MAX_DATA, &h, &desc), TS_EVERSION);
    assert_non_null(desc);
  }
}

static void test_bad_types(void **state) {
  (void)state;
  static const uint16_t types[] = {0, TS_MSG__COUNT, TS_MSG__COUNT + 1, 0x0100, 0xffff};
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
    uint8_t buf[TS_FRAME_HEADER_SIZE];
    ts_frame_encode_header(buf, types[t], 0, 0);
    ts_frame_header_t h;
    const char *desc;
    assert_int_equal(decode(buf, sizeof buf, MAX_DATA, &h, &desc), TS_EPROTO);
    assert_non_null(strstr(desc, "type"));
    assert_string_equal(ts_frame_type_name(types[t]), "UNKNOWN");
  }
  /* Every known type decodes and has a name. */
  for (uint16_t type = 1; type < TS_MSG__COUNT; type++) {
    uint8_t buf[TS_FRAME_HEADER_SIZE];
    ts_frame_encode_header(buf, type, 3, 0);
    ts_frame_header_t h;
    const char *desc;
    assert_int_equal(decode(buf, sizeof buf, MAX_DATA, &h, &desc), TS_FRAME_HEADER_SIZE);
    assert_int_equal(h.type, type);
    assert_string_not_equal(ts_frame_type_name(type), "UNKNOWN");
  }
}

/* Every row of TS_FRAME_MAP: its enum value, its name (the row's NAME), its direction and
 * whether it carries a payload come back from the lookups, and a header of that type
 * round-trips. Replies and the server's own frames go server to client, the rest the other
 * way; only Push and PullReply carry a payload. */
static void test_frame_map_rows(void **state) {
  (void)state;
  static const struct {
    uint16_t type;
    const char *name;
    int dir, data;
  } rows[] = {
#define ROW_(name, value, desc, metrics, dir, data) {value, #name, dir, data},
      TS_FRAME_MAP(ROW_)
#undef ROW_
  };
  assert_int_equal(sizeof rows / sizeof rows[0], TS_MSG__COUNT - 1);
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    uint16_t type = rows[i].type;
    assert_int_equal(type, i + 1); /* values run from 1 without gaps */
    assert_string_equal(ts_frame_type_name(type), rows[i].name);
    assert_int_equal(ts_frame_type_dir(type), rows[i].dir);
    assert_int_equal(ts_frame_type_has_data(type), rows[i].data);
    bool reply = strstr(rows[i].name, "_REPLY") || type == TS_MSG_HELLO || type == TS_MSG_ERROR;
    assert_int_equal(rows[i].dir, reply ? TS_FRAME_S2C : TS_FRAME_C2S);
    uint8_t buf[TS_FRAME_HEADER_SIZE];
    ts_frame_encode_header(buf, type, 5, rows[i].data ? 8 : 0);
    ts_frame_header_t h;
    const char *desc;
    assert_int_equal(decode(buf, sizeof buf, MAX_DATA, &h, &desc), TS_FRAME_HEADER_SIZE);
    assert_int_equal(h.type, type);
    assert_int_equal(h.data_len, rows[i].data ? 8 : 0);
  }
  assert_int_equal(ts_frame_type_dir(0), 0);
  assert_int_equal(ts_frame_type_dir(TS_MSG__COUNT), 0);
  assert_int_equal(ts_frame_type_has_data(TS_MSG__COUNT), 0);
  /* The wire values of a few types, spelled out: renumbering the table breaks the protocol. */
  assert_int_equal(TS_MSG_HELLO, 1);
  assert_int_equal(TS_MSG_PUSH, 8);
  assert_int_equal(TS_MSG_ERROR, 14);
  assert_int_equal(TS_MSG_SHUTDOWN_REPLY, 18);
  assert_int_equal(TS_MSG_MODEL_RESET_REPLY, 20);
}

static void test_meta_limit(void **state) {
  (void)state;
  uint8_t buf[TS_FRAME_HEADER_SIZE];
  ts_frame_header_t h;
  const char *desc;
  ts_frame_encode_header(buf, TS_MSG_DECLARE, TS_FRAME_MAX_META, 0);
  assert_int_equal(decode(buf, sizeof buf, MAX_DATA, &h, &desc), TS_FRAME_HEADER_SIZE);
  assert_int_equal(h.meta_len, 1u << 20);
  ts_frame_encode_header(buf, TS_MSG_DECLARE, TS_FRAME_MAX_META + 1, 0);
  assert_int_equal(decode(buf, sizeof buf, MAX_DATA, &h, &desc), TS_ETOOBIG);
  assert_non_null(desc);
  ts_frame_encode_header(buf, TS_MSG_DECLARE, UINT32_MAX, 0);
  assert_int_equal(decode(buf, sizeof buf, MAX_DATA, &h, &desc), TS_ETOOBIG);
}

static void test_data_on_type_without_data(void **state) {
  (void)state;
  for (uint16_t type = 1; type < TS_MSG__COUNT; type++) {
    uint8_t buf[TS_FRAME_HEADER_SIZE];
    ts_frame_header_t h;
    const char *desc;
    ts_frame_encode_header(buf, type, 0, 4);
    int rc = decode(buf, sizeof buf, MAX_DATA, &h, &desc);
    if (type == TS_MSG_PUSH || type == TS_MSG_PULL_REPLY || type == TS_MSG_SPARSE_PULL ||
        type == TS_MSG_SPARSE_PULL_REPLY || type == TS_MSG_SPARSE_PUSH ||
        type == TS_MSG_TABLE_KEYS_REPLY) {
      assert_true(ts_frame_type_has_data(type));
      assert_int_equal(rc, TS_FRAME_HEADER_SIZE);
      assert_int_equal(h.data_len, 4);
    } else {
      assert_false(ts_frame_type_has_data(type));
      assert_int_equal(rc, TS_EPROTO);
      assert_non_null(strstr(desc, "payload"));
    }
  }
}

static void test_data_not_multiple_of_4(void **state) {
  (void)state;
  static const uint64_t lens[] = {1, 2, 3, 5, 4097, (1ull << 30) - 1};
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
    uint8_t buf[TS_FRAME_HEADER_SIZE];
    ts_frame_header_t h;
    const char *desc;
    ts_frame_encode_header(buf, TS_MSG_PUSH, 0, lens[i]);
    assert_int_equal(decode(buf, sizeof buf, MAX_DATA, &h, &desc), TS_EPROTO);
    assert_non_null(strstr(desc, "float32"));
  }
}

static void test_data_limit(void **state) {
  (void)state;
  static const uint64_t maxes[] = {0, 4, 4096, 1ull << 30, UINT64_MAX - 3};
  for (size_t i = 0; i < sizeof maxes / sizeof maxes[0]; i++) {
    uint64_t max = maxes[i];
    uint8_t buf[TS_FRAME_HEADER_SIZE];
    ts_frame_header_t h;
    const char *desc;
    ts_frame_encode_header(buf, TS_MSG_PULL_REPLY, 0, max);
    assert_int_equal(decode(buf, sizeof buf, max, &h, &desc), TS_FRAME_HEADER_SIZE);
    assert_true(h.data_len == max);
    if (max <= UINT64_MAX - 4) {
      ts_frame_encode_header(buf, TS_MSG_PULL_REPLY, 0, max + 4);
      assert_int_equal(decode(buf, sizeof buf, max, &h, &desc), TS_ETOOBIG);
      assert_non_null(desc);
    }
  }
  /* 4 GiB (a length that no longer fits in 32 bits) against a small limit. */
  uint8_t buf[TS_FRAME_HEADER_SIZE];
  ts_frame_header_t h;
  const char *desc;
  ts_frame_encode_header(buf, TS_MSG_PUSH, 16, 1ull << 32);
  assert_int_equal(decode(buf, sizeof buf, 1 << 20, &h, &desc), TS_ETOOBIG);
  ts_frame_encode_header(buf, TS_MSG_PUSH, 16, (1ull << 32) + 4);
  assert_int_equal(decode(buf, sizeof buf, 1 << 20, &h, &desc), TS_ETOOBIG);
  ts_frame_encode_header(buf, TS_MSG_PUSH, 16, UINT64_MAX - 3);
  assert_int_equal(decode(buf, sizeof buf, 1 << 20, &h, &desc), TS_ETOOBIG);
}

static void test_round_trip(void **state) {
  (void)state;
  static const struct {
    uint16_t type;
    uint32_t meta_len;
    uint64_t data_len;
  } cases[] = {
      {TS_MSG_HELLO, 0, 0},
      {TS_MSG_HANDSHAKE, 1, 0},
      {TS_MSG_ERROR, TS_FRAME_MAX_META, 0},
      {TS_MSG_PUSH, 0x01020304, 0},
      {TS_MSG_PUSH, 12, 0x0000000100000004ull},
      {TS_MSG_PULL_REPLY, 0xabcd, 0x0102030405060708ull & ~3ull},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    /* Decode from an unaligned position with trailing bytes: only 20 are consumed. */
    uint8_t buf[TS_FRAME_HEADER_SIZE + 8];
    memset(buf, 0xee, sizeof buf);
    ts_frame_encode_header(buf + 1, cases[i].type, cases[i].meta_len, cases[i].data_len);
    assert_memory_equal(buf + 1, "TSR1\x01\x00", 6);
    assert_int_equal(buf[0], 0xee);
    assert_int_equal(buf[TS_FRAME_HEADER_SIZE + 1], 0xee);
    ts_frame_header_t h;
    const char *desc;
    int rc = decode(buf + 1, sizeof buf - 1, UINT64_MAX, &h, &desc);
    if (cases[i].meta_len > TS_FRAME_MAX_META) {
      assert_int_equal(rc, TS_ETOOBIG);
      continue;
    }
    assert_int_equal(rc, TS_FRAME_HEADER_SIZE);
    assert_null(desc);
    assert_int_equal(h.version, TS_PROTOCOL_VERSION);
    assert_int_equal(h.type, cases[i].type);
    assert_int_equal(h.meta_len, cases[i].meta_len);
    assert_true(h.data_len == cases[i].data_len);
  }
  /* Little-endian on the wire, whatever the host. */
  uint8_t buf[TS_FRAME_HEADER_SIZE];
  ts_frame_encode_header(buf, 0x0102, 0x03040506, 0x0708090a0b0c0d0eull);
  static const uint8_t want[TS_FRAME_HEADER_SIZE] = {'T', 'S', 'R', '1', 1, 0, 2, 1, 6, 5,
                                                     4, 3, 0x0e, 0x0d, 0x0c, 0x0b, 0x0a, 9, 8, 7};
  assert_memory_equal(buf, want, sizeof want);
}

/* A NULL err_desc is allowed. */
static void test_null_err_desc(void **state) {
  (void)state;
  uint8_t buf[TS_FRAME_HEADER_SIZE];
  ts_frame_header_t h;
  ts_frame_encode_header(buf, 0, 0, 0);
  assert_int_equal(ts_frame_decode_header(buf, sizeof buf, MAX_DATA, &h, NULL), TS_EPROTO);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_short_lengths_incomplete),
      cmocka_unit_test(test_bad_magic_on_prefix),
      cmocka_unit_test(test_wrong_version),
      cmocka_unit_test(test_bad_types),
      cmocka_unit_test(test_frame_map_rows),
      cmocka_unit_test(test_meta_limit),
      cmocka_unit_test(test_data_on_type_without_data),
      cmocka_unit_test(test_data_not_multiple_of_4),
      cmocka_unit_test(test_data_limit),
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_null_err_desc),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
