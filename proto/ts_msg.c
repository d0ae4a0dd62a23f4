#include "ts_msg.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_text.h"

/* The descriptor column of TS_FRAME_MAP (proto/ts_frame.h). */
#define DESC_ROW_(name, value, desc, metrics, dir, data) [value] = &desc,
static const ProtobufCMessageDescriptor *const descriptors[TS_MSG__COUNT] = {
    TS_FRAME_MAP(DESC_ROW_)};
#undef DESC_ROW_

const ProtobufCMessageDescriptor *ts_msg_descriptor(uint16_t type) {
  if (type == 0 || type >= TS_MSG__COUNT) return NULL;
  return descriptors[type];
}

uint64_t ts_msg_parts_bytes(Tessera__PartSlice *const *parts, size_t n) {
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t c = parts[i]->count;
    if (c > (UINT64_MAX / 4) || total > UINT64_MAX - c * 4) return UINT64_MAX;
    total += c * 4;
  }
  return total;
}

static int check_parts(const char *what, Tessera__PartSlice *const *parts, size_t n,
                       uint64_t data_len, int need_count, char *errbuf, size_t errlen) {
  if (n > TS_MSG_MAX_PARTS) {
    snprintf(errbuf, errlen, "%s lists %zu partitions, more than %d", what, n, TS_MSG_MAX_PARTS);
    return TS_EPROTO;
  }
  for (size_t i = 0; i < n; i++) {
    if (need_count && parts[i]->count == 0) {
      snprintf(errbuf, errlen, "%s partition slice %zu has count 0", what, i);
      return TS_EPROTO;
    }
  }
  uint64_t bytes = ts_msg_parts_bytes(parts, n);
  /* UINT64_MAX is the overflow marker, never a size (sizes are multiples of 4): it must not
   * match a data_len of UINT64_MAX from a caller that did not decode the header. */
  if (bytes == UINT64_MAX) {
    snprintf(errbuf, errlen, "%s meta describes more than 2^64 payload bytes", what);
    return TS_ESIZE;
  }
  if (bytes != data_len) {
    snprintf(errbuf, errlen, "%s meta describes %llu payload bytes but the frame carries %llu",
             what, (unsigned long long)bytes, (unsigned long long)data_len);
    return TS_ESIZE;
  }
  return 0;
}

/* A payload of `bytes` described, against the header's data_len. */
static int check_bytes(const char *what, uint64_t bytes, uint64_t data_len, char *errbuf,
                       size_t errlen) {
  if (bytes == data_len) return 0;
  snprintf(errbuf, errlen, "%s describes %llu payload bytes but the frame carries %llu", what,
           (unsigned long long)bytes, (unsigned long long)data_len);
  return TS_ESIZE;
}

static bool finite_nonneg(double v) { return isfinite(v) && v >= 0; }

/* A Declare's tables: what the schema cannot say (the store checks names listed twice). */
static int check_tables(const Tessera__Declare *d, char *errbuf, size_t errlen) {
  if (d->n_tables > TS_MSG_MAX_TABLES) {
    snprintf(errbuf, errlen, "declare lists %zu tables (at most %d allowed)", d->n_tables,
             TS_MSG_MAX_TABLES);
    return TS_EPROTO;
  }
  for (size_t i = 0; i < d->n_tables; i++) {
    const Tessera__TableDecl *t = d->tables[i];
    size_t nl = strlen(t->name);
    const char *bad = NULL;
    if (nl == 0 || nl > TS_MSG_MAX_NAME)
      bad = "a name of 0 or over 256 bytes";
    else if (!ts_text_is_safe(t->name))
      bad = "a name with a control byte or invalid UTF-8";
    else if (t->dim == 0 || t->dim > TS_MSG_MAX_DIM)
      bad = "a width (dim) out of 1 to 4096";
    else if ((unsigned)t->init > TESSERA__ROW_INIT__ROW_INIT_TRUNCATED_NORMAL)
      bad = "an unknown initializer";
    else if ((unsigned)t->optimizer > TESSERA__ROW_OPTIMIZER__ROW_OPT_FTRL)
      bad = "an unknown optimizer";
    else if (!finite_nonneg(t->init_param) || !finite_nonneg(t->learning_rate) ||
             !finite_nonneg(t->beta1) || t->beta1 >= 1 || !finite_nonneg(t->beta2) ||
             t->beta2 >= 1 || !finite_nonneg(t->epsilon) ||
             !finite_nonneg(t->initial_accumulator) || !finite_nonneg(t->l1) ||
             !finite_nonneg(t->l2) || !finite_nonneg(t->beta))
      bad = "a negative or non-finite setting (betas below 1)";
    else if (!(t->admit_probability >= 0 && t->admit_probability <= 1))
      bad = "an admit_probability out of [0, 1]";
    if (bad) {
      snprintf(errbuf, errlen, "table %zu ('%.64s') has %s", i, nl ? t->name : "", bad);
      return TS_EPROTO;
    }
  }
  return 0;
}

static int validate(uint16_t type, const ProtobufCMessage *m, uint64_t data_len, char *errbuf,
                    size_t errlen) {
  switch (type) {
    case TS_MSG_PUSH: {
      const Tessera__Push *p = (const Tessera__Push *)m;
      return check_parts("push", p->parts, p->n_parts, data_len, 1, errbuf, errlen);
    }
    case TS_MSG_PULL_REPLY: {
      const Tessera__PullReply *p = (const Tessera__PullReply *)m;
      return check_parts("pull reply", p->parts, p->n_parts, data_len, 1, errbuf, errlen);
    }
    case TS_MSG_PULL: {
      const Tessera__Pull *p = (const Tessera__Pull *)m;
      if (p->n_parts > TS_MSG_MAX_PARTS) {
        snprintf(errbuf, errlen, "pull lists %zu partitions, more than %d", p->n_parts,
                 TS_MSG_MAX_PARTS);
        return TS_EPROTO;
      }
      return 0;
    }
    case TS_MSG_SPARSE_PULL: {
      const Tessera__SparsePull *p = (const Tessera__SparsePull *)m;
      if (p->num_keys > TS_MSG_MAX_KEYS) {
        snprintf(errbuf, errlen, "sparse pull of %llu keys, more than %llu",
                 (unsigned long long)p->num_keys, (unsigned long long)TS_MSG_MAX_KEYS);
        return TS_ETOOBIG;
      }
      return check_bytes("sparse pull", p->num_keys * 8, data_len, errbuf, errlen);
    }
    case TS_MSG_SPARSE_PULL_REPLY: {
      const Tessera__SparsePullReply *p = (const Tessera__SparsePullReply *)m;
      if (p->dim == 0 || p->dim > TS_MSG_MAX_DIM || p->num_keys > TS_MSG_MAX_KEYS ||
          p->num_keys * p->dim * 4 > TS_MSG_MAX_SPARSE_REPLY) {
        snprintf(errbuf, errlen, "sparse pull reply of %llu rows of width %u is out of range",
                 (unsigned long long)p->num_keys, p->dim);
        return TS_EPROTO;
      }
      return check_bytes("sparse pull reply", p->num_keys * p->dim * 4, data_len, errbuf, errlen);
    }
    case TS_MSG_TABLE_KEYS_REPLY: {
      const Tessera__TableKeysReply *p = (const Tessera__TableKeysReply *)m;
      if (p->num_keys > TS_MSG_MAX_KEYS) {
        snprintf(errbuf, errlen, "table keys reply of %llu keys, more than %llu",
                 (unsigned long long)p->num_keys, (unsigned long long)TS_MSG_MAX_KEYS);
        return TS_EPROTO;
      }
      return check_bytes("table keys reply", p->num_keys * 8, data_len, errbuf, errlen);
    }
    case TS_MSG_SPARSE_PUSH: {
      const Tessera__SparsePush *p = (const Tessera__SparsePush *)m;
      if (p->dim == 0 || p->dim > TS_MSG_MAX_DIM) {
        snprintf(errbuf, errlen, "sparse push of rows of width %u (1 to %d allowed)", p->dim,
                 TS_MSG_MAX_DIM);
        return TS_EPROTO;
      }
      if (p->num_keys > TS_MSG_MAX_KEYS) {
        snprintf(errbuf, errlen, "sparse push of %llu keys, more than %llu",
                 (unsigned long long)p->num_keys, (unsigned long long)TS_MSG_MAX_KEYS);
        return TS_ETOOBIG;
      }
      return check_bytes("sparse push", p->num_keys * ts_msg_sparse_record_bytes(p->dim),
                         data_len, errbuf, errlen);
    }
    case TS_MSG_DECLARE: {
      const Tessera__Declare *d = (const Tessera__Declare *)m;
      if ((d->n_tensors == 0 && d->n_tables == 0) || d->n_tensors > TS_MSG_MAX_TENSORS) {
        snprintf(errbuf, errlen, "declare lists %zu tensors (1 to %d allowed, or 0 with tables)",
                 d->n_tensors, TS_MSG_MAX_TENSORS);
        return TS_EPROTO;
      }
      int trc = check_tables(d, errbuf, errlen);
      if (trc) return trc;
      for (size_t i = 0; i < d->n_tensors; i++) {
        const Tessera__TensorDecl *t = d->tensors[i];
        size_t nl = strlen(t->name);
        if (nl == 0 || nl > TS_MSG_MAX_NAME) {
          snprintf(errbuf, errlen, "tensor %zu has a name of %zu bytes (1 to %d allowed)", i, nl,
                   TS_MSG_MAX_NAME);
          return TS_EPROTO;
        }
        /* Names reach psctl, /status and logs: text only (base/ts_text.h). */
        if (!ts_text_is_safe(t->name)) {
          snprintf(errbuf, errlen, "tensor %zu has a name with a control byte or invalid UTF-8",
                   i);
          return TS_EPROTO;
        }
        if (t->n_shape == 0 || t->n_shape > TS_MSG_MAX_RANK) {
          snprintf(errbuf, errlen, "tensor '%s' has rank %zu (1 to %d allowed)", t->name,
                   t->n_shape, TS_MSG_MAX_RANK);
          return TS_EPROTO;
        }
        uint64_t elems = 1;
        for (size_t k = 0; k < t->n_shape; k++) {
          uint64_t dim = t->shape[k];
          if (dim == 0 || elems > (UINT64_MAX / 4) / dim) {
            snprintf(errbuf, errlen, "tensor '%s' has an empty or oversized shape", t->name);
            return TS_EPROTO;
          }
          elems *= dim;
        }
        if (t->init != TESSERA__INIT__INIT_ZEROS && t->init != TESSERA__INIT__INIT_ONES &&
            t->init != TESSERA__INIT__INIT_GLOROT_UNIFORM) {
          snprintf(errbuf, errlen, "tensor '%s' has an unknown initializer %d", t->name,
                   (int)t->init);
          return TS_EPROTO;
        }
      }
      return 0;
    }
    default:
      return 0;
  }
}

int ts_msg_decode(uint16_t type, const uint8_t *meta, size_t meta_len, uint64_t data_len,
                  ProtobufCMessage **out, char *errbuf, size_t errlen) {
  *out = NULL;
  const ProtobufCMessageDescriptor *d = ts_msg_descriptor(type);
  if (!d) {
    snprintf(errbuf, errlen, "unknown frame type %u", (unsigned)type);
    return TS_EPROTO;
  }
  if (meta_len > TS_FRAME_MAX_META) {
    snprintf(errbuf, errlen, "meta of %zu bytes exceeds 1 MiB", meta_len);
    return TS_ETOOBIG;
  }
  ProtobufCMessage *m = protobuf_c_message_unpack(d, &ts_protobuf_allocator, meta_len, meta);
  if (!m) {
    snprintf(errbuf, errlen, "malformed %s meta (%zu bytes do not parse as %s)",
             ts_frame_type_name(type), meta_len, d->name);
    return TS_EPROTO;
  }
  int rc = validate(type, m, data_len, errbuf, errlen);
  if (rc < 0) {
    protobuf_c_message_free_unpacked(m, &ts_protobuf_allocator);
    return rc;
  }
  *out = m;
  return 0;
}

void ts_msg_free(ProtobufCMessage *msg) {
  if (msg) protobuf_c_message_free_unpacked(msg, &ts_protobuf_allocator);
}

size_t ts_msg_frame_size(const ProtobufCMessage *msg) {
  return TS_FRAME_HEADER_SIZE + protobuf_c_message_get_packed_size(msg);
}

size_t ts_msg_encode(uint16_t type, const ProtobufCMessage *msg, uint64_t data_len, uint8_t *dst) {
  size_t meta_len = protobuf_c_message_pack(msg, dst + TS_FRAME_HEADER_SIZE);
  ts_frame_encode_header(dst, type, (uint32_t)meta_len, data_len);
  return TS_FRAME_HEADER_SIZE + meta_len;
}

const char *ts_msg_mode_name(Tessera__Mode m) {
  switch (m) {
    case TESSERA__MODE__MODE_ASYNC:
      return "async";
    case TESSERA__MODE__MODE_SYNC:
      return "sync";
    case TESSERA__MODE__MODE_SSP:
      return "ssp";
    default:
      return "unknown";
  }
}
