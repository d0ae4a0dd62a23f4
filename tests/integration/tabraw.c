/*
 * Embedding tables in raw frames (tabraw.h).
 */
#include "tabraw.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rawconn.h"
#include "ts_frame.h"
#include "ts_key.h"
#include "ts_msg.h"
/* --- frames ------------------------------------------------------------------------ */

/* Read one frame with its payload; the type, or -1. */
int tt_read_frame(int fd, tt_frame_t *f) {
  uint8_t h[TS_FRAME_HEADER_SIZE];
  f->data = NULL;
  f->data_len = 0;
  if (ts_raw_read_full(fd, h, sizeof h, 10000) < 0) return -1;
  ts_frame_header_t hdr;
  if (ts_frame_decode_header(h, sizeof h, UINT64_MAX, &hdr, NULL) < 0) return -1;
  if (hdr.meta_len > sizeof f->meta || ts_raw_read_full(fd, f->meta, hdr.meta_len, 10000) < 0)
    return -1;
  f->meta_len = hdr.meta_len;
  if (hdr.data_len) {
    f->data = malloc(hdr.data_len);
    assert_non_null(f->data);
    if (ts_raw_read_full(fd, f->data, hdr.data_len, 10000) < 0) return -1;
    f->data_len = hdr.data_len;
  }
  f->type = hdr.type;
  return hdr.type;
}

/* The code of an Error frame f (its detail into detail), else 0. */
int tt_error_of(const tt_frame_t *f, char *detail, size_t n) {
  if (f->type != TS_MSG_ERROR) return 0;
  Tessera__Error *e = tessera__error__unpack(NULL, f->meta_len, f->meta);
  assert_non_null(e);
  int code = e->code;
  if (detail) snprintf(detail, n, "%s", e->detail);
  tessera__error__free_unpacked(e, NULL);
  return code;
}

/* --- requests ---------------------------------------------------------------------- */

Tessera__TableDecl tt_table_decl(const char *name, uint32_t dim, Tessera__RowOptimizer opt,
                                 double lr) {
  Tessera__TableDecl t = TESSERA__TABLE_DECL__INIT;
  t.name = (char *)name;
  t.dim = dim;
  t.init = TESSERA__ROW_INIT__ROW_INIT_UNIFORM;
  t.init_param = 0.05;
  t.optimizer = opt;
  t.learning_rate = lr;
  return t;
}

/* Declare tables t[0..n) (no tensors); 0 or the error's code (detail into detail). */
int tt_declare(int fd, Tessera__TableDecl *t, size_t n, char *detail, size_t dn) {
  Tessera__TableDecl *tp[8];
  for (size_t i = 0; i < n; i++) tp[i] = &t[i];
  Tessera__Declare d = TESSERA__DECLARE__INIT;
  d.request_id = 2;
  d.seed = TT_SEED;
  d.tables = tp;
  d.n_tables = n;
  ts_raw_send_msg(fd, TS_MSG_DECLARE, &d.base, 0);
  tt_frame_t f;
  int type = tt_read_frame(fd, &f);
  free(f.data);
  if (type == TS_MSG_DECLARE_REPLY) return 0;
  assert_int_equal(type, TS_MSG_ERROR);
  return tt_error_of(&f, detail, dn);
}

void tt_send_pull(int fd, uint64_t id, uint32_t table, const uint64_t *keys, size_t n,
                  uint64_t min_version) {
  Tessera__SparsePull p = TESSERA__SPARSE_PULL__INIT;
  p.request_id = id;
  p.table = table;
  p.num_keys = n;
  p.min_version = min_version;
  p.timeout_ms = 10000;
  ts_raw_send_msg(fd, TS_MSG_SPARSE_PULL, &p.base, n * 8);
  ts_raw_send_all(fd, keys, n * 8);
}

/* The reply to a pull: 0 with rows (n x dim) and *version, or the error's code. */
int tt_read_pull(int fd, float *rows, size_t n, uint32_t dim, uint64_t *version, char *detail,
                 size_t dn) {
  return tt_read_pull_of(fd, 0, rows, n, dim, version, detail, dn);
}

int tt_read_pull_of(int fd, uint64_t id, float *rows, size_t n, uint32_t dim, uint64_t *version,
                    char *detail, size_t dn) {
  tt_frame_t f;
  int type = tt_read_frame(fd, &f);
  if (type != TS_MSG_SPARSE_PULL_REPLY) {
    assert_int_equal(type, TS_MSG_ERROR);
    free(f.data);
    if (id) {
      Tessera__Error *e = tessera__error__unpack(NULL, f.meta_len, f.meta);
      assert_non_null(e);
      assert_int_equal(e->request_id, id);
      tessera__error__free_unpacked(e, NULL);
    }
    return tt_error_of(&f, detail, dn);
  }
  Tessera__SparsePullReply *r = tessera__sparse_pull_reply__unpack(NULL, f.meta_len, f.meta);
  assert_non_null(r);
  if (id) assert_int_equal(r->request_id, id);
  assert_int_equal(r->num_keys, n);
  assert_int_equal(r->dim, dim);
  assert_int_equal(f.data_len, n * dim * 4);
  if (version) *version = r->version;
  if (n) memcpy(rows, f.data, n * dim * 4);
  tessera__sparse_pull_reply__free_unpacked(r, NULL);
  free(f.data);
  return 0;
}

int tt_pull(int fd, uint32_t table, const uint64_t *keys, size_t n, uint32_t dim, float *rows,
            uint64_t *version, char *detail, size_t dn) {
  tt_send_pull(fd, 7, table, keys, n, 0);
  return tt_read_pull(fd, rows, n, dim, version, detail, dn);
}

void tt_send_push(int fd, uint32_t table, uint32_t dim, uint64_t step, uint64_t push_id,
                  const uint64_t *keys, const float *grads, size_t n) {
  tt_send_push_pull(fd, table, dim, step, push_id, 0, keys, grads, n);
}

void tt_send_push_pull(int fd, uint32_t table, uint32_t dim, uint64_t step, uint64_t push_id,
                       uint64_t pull_id, const uint64_t *keys, const float *grads, size_t n) {
  tt_send_push_piece(fd, table, dim, step, push_id, pull_id, 0, keys, grads, n);
}

static void send_push(int fd, uint32_t table, uint32_t dim, uint64_t step, uint64_t push_id,
                      uint64_t pull_id, uint32_t piece, const uint64_t *keys, const float *grads,
                      size_t n, size_t sent) {
  Tessera__SparsePush p = TESSERA__SPARSE_PUSH__INIT;
  p.request_id = TT_PUSH_ID;
  p.pull_request_id = pull_id;
  p.piece = piece;
  p.table = table;
  p.num_keys = n;
  p.dim = dim;
  p.step = step;
  p.push_id = push_id;
  p.client_incarnation = push_id ? 77 : 0;
  size_t rec = 8 + 4 * (size_t)dim;
  uint8_t *buf = malloc(n * rec + 1);
  for (size_t i = 0; i < n; i++) {
    memcpy(buf + i * rec, &keys[i], 8);
    memcpy(buf + i * rec + 8, grads + i * dim, 4 * (size_t)dim);
  }
  ts_raw_send_msg(fd, TS_MSG_SPARSE_PUSH, &p.base, n * rec);
  ts_raw_send_all(fd, buf, sent * rec);
  free(buf);
}

void tt_send_push_piece(int fd, uint32_t table, uint32_t dim, uint64_t step, uint64_t push_id,
                        uint64_t pull_id, uint32_t piece, const uint64_t *keys, const float *grads,
                        size_t n) {
  send_push(fd, table, dim, step, push_id, pull_id, piece, keys, grads, n, n);
}

void tt_send_push_cut(int fd, uint32_t table, uint32_t dim, uint64_t step, uint64_t push_id,
                      const uint64_t *keys, const float *grads, size_t n, size_t sent) {
  send_push(fd, table, dim, step, push_id, 0, 0, keys, grads, n, sent);
}

int tt_read_push(int fd, tt_push_reply_t *out, char *detail, size_t dn) {
  tt_frame_t f;
  int type = tt_read_frame(fd, &f);
  free(f.data);
  if (type != TS_MSG_SPARSE_PUSH_REPLY) {
    assert_int_equal(type, TS_MSG_ERROR);
    return tt_error_of(&f, detail, dn);
  }
  Tessera__SparsePushReply *r = tessera__sparse_push_reply__unpack(NULL, f.meta_len, f.meta);
  assert_non_null(r);
  if (out) *out = (tt_push_reply_t){r->result, r->rows, r->rows_filtered};
  tessera__sparse_push_reply__free_unpacked(r, NULL);
  return 0;
}

int tt_push(int fd, uint32_t table, uint32_t dim, uint64_t step, const uint64_t *keys,
            const float *grads, size_t n, tt_push_reply_t *out, char *detail, size_t dn) {
  tt_send_push(fd, table, dim, step, 0, keys, grads, n);
  return tt_read_push(fd, out, detail, dn);
}

Tessera__TableKeysReply *tt_keys_page(int fd, uint64_t max_keys, uint64_t *data_len) {
  Tessera__TableKeys m = TESSERA__TABLE_KEYS__INIT;
  m.request_id = 200;
  m.max_keys = max_keys;
  ts_raw_send_msg(fd, TS_MSG_TABLE_KEYS, &m.base, 0);
  tt_frame_t f;
  assert_int_equal(tt_read_frame(fd, &f), TS_MSG_TABLE_KEYS_REPLY);
  free(f.data);
  *data_len = f.data_len;
  Tessera__TableKeysReply *r = tessera__table_keys_reply__unpack(NULL, f.meta_len, f.meta);
  assert_non_null(r);
  return r;
}

Tessera__ShardStatus *tt_status(int fd) {
  Tessera__Status st = TESSERA__STATUS__INIT;
  st.request_id = 5;
  ts_raw_send_msg(fd, TS_MSG_STATUS, &st.base, 0);
  tt_frame_t f;
  assert_int_equal(tt_read_frame(fd, &f), TS_MSG_STATUS_REPLY);
  free(f.data);
  Tessera__ShardStatus *r = tessera__shard_status__unpack(NULL, f.meta_len, f.meta);
  assert_non_null(r);
  return r;
}

/* n keys of shard `shard` of num_shards, ascending, from `from` on. */
void tt_shard_keys(uint64_t *out, size_t n, uint32_t shard, uint32_t num_shards, uint64_t from) {
  for (uint64_t k = from; n; k++)
    if (ts_key_shard(k, num_shards) == shard) {
      *out++ = k;
      n--;
    }
}

int tt_worker(ts_cluster_t *c, int shard, int task) {
  int fd = ts_raw_worker(c->port[shard], task, "tabraw");
  assert_true(fd >= 0);
  return fd;
}