/*
 * Fuzz target: one frame off the wire, as a connection's reader sees it. The header decoder
 * runs on every input; when it has a whole header and the meta it announces, the message
 * decoder runs on that meta against the header's type and data_len (the payload itself need
 * not be present: the decoders never read it). Beyond "no crash, no leak" it checks the
 * codecs' contracts, so a logic slip aborts too.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_target.h"
#include "ts_err.h"
#include "ts_frame.h"
#include "ts_msg.h"

/* A payload limit in the range a server uses; large enough that data_len checks matter. */
#define FUZZ_MAX_DATA (1ull << 30)

static void check(int ok, const char *what) {
  if (ok) return;
  fprintf(stderr, "fuzz_frame: invariant violated: %s\n", what);
  abort();
}

/* True when m or a message inside it kept unknown fields. protobuf-c re-emits those as it
 * read them, except that it accepts field number 0 written as a multi-byte tag and re-emits
 * it as the one-byte tag 0, which it then refuses: only messages without unknown fields are
 * held to a strict round trip. */
static int has_unknown_fields(const ProtobufCMessage *m) {
  if (m->n_unknown_fields) return 1;
  const ProtobufCMessageDescriptor *d = m->descriptor;
  const char *base = (const char *)m;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n;
      ProtobufCMessage **v;
      memcpy(&n, base + f->quantifier_offset, sizeof n);
      memcpy(&v, base + f->offset, sizeof v);
      for (size_t k = 0; k < n; k++)
        if (has_unknown_fields(v[k])) return 1;
    } else {
      ProtobufCMessage *sub;
      memcpy(&sub, base + f->offset, sizeof sub);
      if (sub && has_unknown_fields(sub)) return 1;
    }
  }
  return 0;
}

/* A message that decoded re-encodes to a frame that decodes to the same packed bytes. */
static void check_reencode(uint16_t type, const ProtobufCMessage *m, uint64_t data_len) {
  size_t n = ts_msg_frame_size(m);
  /* Packing may grow a meta (an int32 sent as a 5-byte varint goes out sign-extended to 10
   * bytes): one pushed over the limit is the sender's to avoid, not a decoder bug. */
  if (n - TS_FRAME_HEADER_SIZE > TS_FRAME_MAX_META) return;
  uint8_t *buf = malloc(n);
  check(buf != NULL, "malloc");
  check(ts_msg_encode(type, m, data_len, buf) == n, "encode writes frame_size bytes");
  ts_frame_header_t h;
  check(ts_frame_decode_header(buf, n, FUZZ_MAX_DATA, &h, NULL) == TS_FRAME_HEADER_SIZE,
        "re-encoded header decodes");
  check(h.type == type && h.data_len == data_len && h.meta_len == n - TS_FRAME_HEADER_SIZE,
        "re-encoded header fields");
  ProtobufCMessage *again = NULL;
  char err[256];
  int rc = ts_msg_decode(type, buf + TS_FRAME_HEADER_SIZE, h.meta_len, data_len, &again, err,
                         sizeof err);
  if (rc != 0 && has_unknown_fields(m)) {
    free(buf);
    return;
  }
  check(rc == 0 && again != NULL, "re-encoded meta decodes");
  size_t n2 = protobuf_c_message_get_packed_size(again);
  check(n2 == h.meta_len, "re-encoded meta keeps its size");
  uint8_t *buf2 = malloc(n2 + 1);
  check(buf2 != NULL, "malloc");
  protobuf_c_message_pack(again, buf2);
  check(memcmp(buf2, buf + TS_FRAME_HEADER_SIZE, n2) == 0, "re-encoded meta is stable");
  free(buf2);
  ts_msg_free(again);
  free(buf);
}

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
  check(m->descriptor == ts_msg_descriptor(h.type), "message of the frame's type");
  if (h.type == TS_MSG_PUSH) {
    const Tessera__Push *p = (const Tessera__Push *)m;
    check(ts_msg_parts_bytes(p->parts, p->n_parts) == h.data_len, "push payload matches");
  } else if (h.type == TS_MSG_PULL_REPLY) {
    const Tessera__PullReply *p = (const Tessera__PullReply *)m;
    check(ts_msg_parts_bytes(p->parts, p->n_parts) == h.data_len, "pull reply payload matches");
  }
  check_reencode(h.type, m, h.data_len);
  ts_msg_free(m);
  return 0;
}
