#include "ts_frame.h"

#include <string.h>

#include "ts_err.h"

_Static_assert(TS_FRAME_NUM_TYPES == TS_MSG__COUNT - 1,
               "TS_FRAME_MAP values must run from 1 without gaps");

typedef struct {
  const char *name;
  int dir;
  int data;
} type_info_t;

#define TYPE_ROW_(name, value, desc, metrics, dir, data) [value] = {#name, dir, data},
static const type_info_t types[TS_MSG__COUNT] = {TS_FRAME_MAP(TYPE_ROW_)};
#undef TYPE_ROW_

static const type_info_t *type_info(uint16_t type) {
  return type == 0 || type >= TS_MSG__COUNT ? NULL : &types[type];
}

const char *ts_frame_type_name(uint16_t type) {
  const type_info_t *t = type_info(type);
  return t ? t->name : "UNKNOWN";
}

int ts_frame_type_has_data(uint16_t type) {
  const type_info_t *t = type_info(type);
  return t ? t->data : 0;
}

int ts_frame_type_dir(uint16_t type) {
  const type_info_t *t = type_info(type);
  return t ? t->dir : 0;
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint32_t rd32(const uint8_t *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | ((uint64_t)rd32(p + 4) << 32); }

static void wr16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

static void wr32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void wr64(uint8_t *p, uint64_t v) {
  wr32(p, (uint32_t)v);
  wr32(p + 4, (uint32_t)(v >> 32));
}

static int fail(const char **err_desc, const char *desc, int code) {
  if (err_desc) *err_desc = desc;
  return code;
}

int ts_frame_decode_header(const uint8_t *src, size_t len, uint64_t max_data,
                           ts_frame_header_t *out, const char **err_desc) {
  /* The magic is checked on whatever prefix is there, so garbage is refused at once
   * instead of waiting for 20 bytes that may never come. */
  size_t have = len < 4 ? len : 4;
  /* have == 0 skips memcmp: src may be NULL for an empty buffer. */
  if (have && memcmp(src, TS_FRAME_MAGIC, have) != 0)
    return fail(err_desc, "bad magic (not a Tessera frame)", TS_EPROTO);
  if (len < TS_FRAME_HEADER_SIZE) return TS_EINCOMPLETE;

  ts_frame_header_t h = {
      .version = rd16(src + 4),
      .type = rd16(src + 6),
      .meta_len = rd32(src + 8),
      .data_len = rd64(src + 12),
  };
  if (h.version != TS_PROTOCOL_VERSION)
    return fail(err_desc, "unsupported protocol version", TS_EVERSION);
  if (h.type == 0 || h.type >= TS_MSG__COUNT)
    return fail(err_desc, "unknown frame type", TS_EPROTO);
  if (h.meta_len > TS_FRAME_MAX_META)
    return fail(err_desc, "meta larger than 1 MiB", TS_ETOOBIG);
  if (h.data_len != 0 && !ts_frame_type_has_data(h.type))
    return fail(err_desc, "payload on a frame type that carries none", TS_EPROTO);
  if (h.data_len % 4 != 0)
    return fail(err_desc, "payload is not a whole number of float32 values", TS_EPROTO);
  if (h.data_len > max_data)
    return fail(err_desc, "payload larger than this server accepts", TS_ETOOBIG);
  *out = h;
  return TS_FRAME_HEADER_SIZE;
}

void ts_frame_encode_header(uint8_t *dst, uint16_t type, uint32_t meta_len, uint64_t data_len) {
  memcpy(dst, TS_FRAME_MAGIC, 4);
  wr16(dst + 4, TS_PROTOCOL_VERSION);
  wr16(dst + 6, type);
  wr32(dst + 8, meta_len);
  wr64(dst + 12, data_len);
}
