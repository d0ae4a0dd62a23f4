#include "fuzz_msg_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ts_frame.h"
#include "ts_msg.h"

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
static void check_reencode(const char *target, uint16_t type, const ProtobufCMessage *m,
                           uint64_t data_len) {
  size_t n = ts_msg_frame_size(m);
  /* Packing may grow a meta (an int32 sent as a 5-byte varint goes out sign-extended to 10
   * bytes): one pushed over the limit is the sender's to avoid, not a decoder bug. */
  if (n - TS_FRAME_HEADER_SIZE > TS_FRAME_MAX_META) return;
  uint8_t *buf = malloc(n);
  fuzz_check(buf != NULL, target, "malloc");
  fuzz_check(ts_msg_encode(type, m, data_len, buf) == n, target, "encode writes frame_size bytes");
  ts_frame_header_t h;
  fuzz_check(ts_frame_decode_header(buf, n, UINT64_MAX, &h, NULL) == TS_FRAME_HEADER_SIZE, target,
             "re-encoded header decodes");
  fuzz_check(h.type == type && h.data_len == data_len && h.meta_len == n - TS_FRAME_HEADER_SIZE,
             target, "re-encoded header fields");
  ProtobufCMessage *again = NULL;
  char err[256];
  int rc = ts_msg_decode(type, buf + TS_FRAME_HEADER_SIZE, h.meta_len, data_len, &again, err,
                         sizeof err);
  if (rc != 0 && has_unknown_fields(m)) {
    free(buf);
    return;
  }
  fuzz_check(rc == 0 && again != NULL, target, "re-encoded meta decodes");
  size_t n2 = protobuf_c_message_get_packed_size(again);
  fuzz_check(n2 == h.meta_len, target, "re-encoded meta keeps its size");
  uint8_t *buf2 = malloc(n2 + 1);
  fuzz_check(buf2 != NULL, target, "malloc");
  protobuf_c_message_pack(again, buf2);
  fuzz_check(memcmp(buf2, buf + TS_FRAME_HEADER_SIZE, n2) == 0, target,
             "re-encoded meta is stable");
  free(buf2);
  ts_msg_free(again);
  free(buf);
}

void fuzz_check_decoded(const char *target, uint16_t type, const ProtobufCMessage *m,
                        uint64_t data_len) {
  fuzz_check(m->descriptor == ts_msg_descriptor(type), target, "message of the frame's type");
  if (type == TS_MSG_PUSH) {
    const Tessera__Push *p = (const Tessera__Push *)m;
    fuzz_check(ts_msg_parts_bytes(p->parts, p->n_parts) == data_len, target,
               "push payload matches");
  } else if (type == TS_MSG_PULL_REPLY) {
    const Tessera__PullReply *p = (const Tessera__PullReply *)m;
    fuzz_check(ts_msg_parts_bytes(p->parts, p->n_parts) == data_len, target,
               "pull reply payload matches");
  } else if (type == TS_MSG_TABLE_KEYS_REPLY) {
    const Tessera__TableKeysReply *p = (const Tessera__TableKeysReply *)m;
    fuzz_check(p->num_keys * 8 == data_len, target, "table keys reply payload matches");
  } else {
    fuzz_check(data_len == 0, target, "no payload on a type without one");
  }
  check_reencode(target, type, m, data_len);
}
