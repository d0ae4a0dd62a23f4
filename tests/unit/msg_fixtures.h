/* Helpers shared by the message codec unit tests (test_msg.c, test_msg_invalid.c): one frame
 * through ts_msg_encode, the header decoder and ts_msg_decode, expecting success (the
 * decoded message packs byte-identical) or an error, and a few PartSlices. Each test program
 * includes this once; everything here is static. */
#ifndef TS_TEST_MSG_FIXTURES_H
#define TS_TEST_MSG_FIXTURES_H

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

/* One frame: encode msg, decode the header back, then the meta. Returns ts_msg_decode's
 * result; *out as ts_msg_decode leaves it. */
static inline int frame_round_trip(uint16_t type, const ProtobufCMessage *msg, uint64_t data_len,
                                   ProtobufCMessage **out, char *err, size_t errlen) {
  size_t n = ts_msg_frame_size(msg);
  uint8_t *buf = malloc(n);
  assert_non_null(buf);
  assert_int_equal(ts_msg_encode(type, msg, data_len, buf), n);

  ts_frame_header_t h;
  const char *desc = NULL;
  assert_int_equal(ts_frame_decode_header(buf, n, UINT64_MAX - 3, &h, &desc), TS_FRAME_HEADER_SIZE);
  assert_int_equal(h.type, type);
  assert_int_equal(h.meta_len, n - TS_FRAME_HEADER_SIZE);
  assert_true(h.data_len == data_len);

  err[0] = '\0';
  int rc =
      ts_msg_decode(h.type, buf + TS_FRAME_HEADER_SIZE, h.meta_len, h.data_len, out, err, errlen);
  free(buf);
  return rc;
}

/* Packs of the original and the decoded message are byte-identical: every field survived. */
static inline void assert_same_packed(const ProtobufCMessage *a, const ProtobufCMessage *b) {
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

static inline ProtobufCMessage *decode_ok(uint16_t type, const ProtobufCMessage *msg,
                                          uint64_t data_len) {
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

static inline int decode_err(uint16_t type, const ProtobufCMessage *msg, uint64_t data_len,
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

static inline Tessera__PartSlice **make_slices(size_t n, uint64_t count0) {
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

#endif
