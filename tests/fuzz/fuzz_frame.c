/*
 * Fuzz target: one frame off the wire, as a connection's reader sees it. The header decoder
 * runs on every input; when it has a whole header and the meta it announces, the message
 * decoder runs on that meta against the header's type and data_len (the payload itself need
 * not be present: the decoders never read it). Beyond "no crash, no leak" it checks the
 * codecs' contracts, so a logic slip aborts too.
 */
#include "fuzz_msg_check.h"
#include "fuzz_target.h"
#include "ts_err.h"
#include "ts_frame.h"
#include "ts_msg.h"

/* A payload limit in the range a server uses; large enough that data_len checks matter. */
#define FUZZ_MAX_DATA (1ull << 30)

static void check(int ok, const char *what) { fuzz_check(ok, "fuzz_frame", what); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ts_frame_header_t h;
  const char *desc = NULL;
  int rc = ts_frame_decode_header(data, size, FUZZ_MAX_DATA, &h, &desc);
  if (rc == TS_EINCOMPLETE) {
    check(size < TS_FRAME_HEADER_SIZE, "incomplete only when short");
    return 0;
  }
  if (rc < 0) {
    check(desc != NULL, "a header error has a description");
    check(rc == TS_EPROTO || rc == TS_EVERSION || rc == TS_ETOOBIG, "header error code");
    return 0;
  }
  check(rc == TS_FRAME_HEADER_SIZE, "header consumes 20 bytes");
  check(h.type != 0 && h.type < TS_MSG__COUNT, "header type in range");
  check(h.meta_len <= TS_FRAME_MAX_META, "meta_len within limit");
  check(h.data_len <= FUZZ_MAX_DATA && h.data_len % 4 == 0, "data_len within limit");
  check(h.data_len == 0 || ts_frame_type_has_data(h.type), "data only where allowed");

  if (size - TS_FRAME_HEADER_SIZE < h.meta_len) return 0; /* meta not here yet */
  ProtobufCMessage *m = (ProtobufCMessage *)&h; /* must be reset to NULL on failure */
  char err[256];
  err[0] = '\0';
  rc = ts_msg_decode(h.type, data + TS_FRAME_HEADER_SIZE, h.meta_len, h.data_len, &m, err,
                     sizeof err);
  if (rc < 0) {
    check(m == NULL, "no message on error");
    check(err[0] != '\0', "a message error has a description");
    check(rc == TS_EPROTO || rc == TS_ESIZE || rc == TS_ETOOBIG, "message error code");
    return 0;
  }
  check(rc == 0 && m != NULL, "a message on success");
  fuzz_check_decoded("fuzz_frame", h.type, m, h.data_len);
  ts_msg_free(m);
  return 0;
}
