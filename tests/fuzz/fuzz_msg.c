/*
 * Fuzz target: the message decoder alone, without the frame header in front. Input: u8 frame
 * type (taken modulo TS_MSG__COUNT + 1, so 0 and TS_MSG__COUNT stand for unknown types), u64
 * data_len (little-endian, any value: the decoder must not trust it), then the meta. A
 * message that decodes must pass fuzz_check_decoded (payload size, round trip); the types
 * without a payload must decode the same whatever data_len says.
 */
#include <string.h>

#include "fuzz_msg_check.h"
#include "fuzz_target.h"
#include "ts_err.h"
#include "ts_frame.h"
#include "ts_msg.h"

#define INPUT_HEADER 9 /* type byte + data_len */

static void check(int ok, const char *what) { fuzz_check(ok, "fuzz_msg", what); }

static uint64_t rd64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* Decodes and checks the error contract; returns rc, *out owns the message on success. */
static int decode(uint16_t type, const uint8_t *meta, size_t meta_len, uint64_t data_len,
                  ProtobufCMessage **out) {
  char err[256];
  memset(err, 0x55, sizeof err);
  *out = (ProtobufCMessage *)err; /* must be reset to NULL on failure */
  int rc = ts_msg_decode(type, meta, meta_len, data_len, out, err, sizeof err);
  if (rc < 0) {
    check(*out == NULL, "no message on error");
    check(err[0] != '\0' && memchr(err, '\0', sizeof err) != NULL,
          "a message error has a terminated description");
    check(rc == TS_EPROTO || rc == TS_ESIZE || rc == TS_ETOOBIG, "message error code");
    check(rc != TS_ESIZE || ts_frame_type_has_data(type), "size errors only with a payload");
    return rc;
  }
  check(rc == 0 && *out != NULL, "a message on success");
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < INPUT_HEADER) return 0;
  uint16_t type = (uint16_t)(data[0] % (TS_MSG__COUNT + 1));
  uint64_t data_len = rd64(data + 1);
  const uint8_t *meta = data + INPUT_HEADER;
  size_t meta_len = size - INPUT_HEADER;

  ProtobufCMessage *m;
  int rc = decode(type, meta, meta_len, data_len, &m);
  if (type == 0 || type >= TS_MSG__COUNT) {
    check(rc == TS_EPROTO, "an unknown type is a protocol error");
    return 0;
  }
  if (!ts_frame_type_has_data(type)) {
    /* data_len is none of these types' business: the answer must not depend on it. */
    ProtobufCMessage *m0;
    int rc0 = decode(type, meta, meta_len, 0, &m0);
    check(rc0 == rc, "a type without payload ignores data_len");
    ts_msg_free(m0);
    data_len = 0;
  }
  if (rc < 0) return 0;
  fuzz_check_decoded("fuzz_msg", type, m, data_len);
  ts_msg_free(m);
  return 0;
}
