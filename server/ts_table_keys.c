/*
 * TableKeys (tessera.proto; docs/architecture.md, "Tables"): a page of the keys of one
 * table's rows on this shard, for evaluation and export of a table with no bounded
 * vocabulary.
 *
 * The request carries no payload and asks for at most 2^20 keys; the reply is built on the
 * loop, synchronously, into a buffer of its own (an 8 MiB page at most), charged to the
 * connection's reply budget (server.max_reply_bytes_per_connection, server.max_reply_bytes)
 * until written, as a SparsePull's reply is. One page looks at no more than
 * SLOTS_PER_KEY x max_keys row slots (64 Ki at least), so a table of mostly erased rows
 * makes several short pages rather than one long walk on the loop. A bad request (no
 * model, an unknown table, max_keys 0 or over 2^20, a cursor past the table's row slots)
 * is answered with a typed error and holds nothing.
 */
#include "ts_server_int.h"

#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"

/* Row slots one page may look at per key asked for (and at least MIN_SLOTS). */
#define SLOTS_PER_KEY 4
#define MIN_SLOTS ((uint64_t)1 << 16)

/* A reply's keys, freed once written (or cancelled), and what was charged for them. */
typedef struct {
  size_t charged;
  uint64_t keys[];
} keys_buf_t;

static void on_sent(ts_conn_t *c, void *arg, int err) {
  (void)err;
  keys_buf_t *kb = arg;
  ts_conn_charge(c, -(int64_t)kb->charged);
  ts_free(kb);
}

static void handle(ts_session_t *s, const Tessera__TableKeys *m) {
  ts_server_t *srv = s->srv;
  ts_store_t *st = &srv->store;
  char err[256];
  if (!st->declared) {
    ts_errmsg_printf(err, sizeof err, "no model is declared on shard %u yet", srv->shard);
    ts_session_reply_error(s, TS_MSG_TABLE_KEYS, m->request_id, TS_ENOTDECLARED, err);
    return;
  }
  ts_stable_t *t = ts_store_table(st, m->table);
  if (!t) {
    ts_errmsg_printf(err, sizeof err, "table index %u: the model declares %u table(s)", m->table,
                     st->num_tables);
    ts_session_reply_error(s, TS_MSG_TABLE_KEYS, m->request_id, TS_ENOTABLE, err);
    return;
  }
  if (m->max_keys == 0 || m->max_keys > TS_MSG_MAX_KEYS) {
    ts_errmsg_printf(err, sizeof err, "a key listing of %llu keys a page: ask for 1 to %llu",
                     (unsigned long long)m->max_keys, (unsigned long long)TS_MSG_MAX_KEYS);
    ts_session_reply_error(s, TS_MSG_TABLE_KEYS, m->request_id, TS_EINVAL, err);
    return;
  }
  const ts_table_t *rows = ts_stable_rows(t);
  if (m->cursor > rows->next_row) {
    ts_errmsg_printf(err, sizeof err,
                     "cursor %llu is past the %llu row slots of table '%s' on shard %u (a "
                     "cursor comes from a reply; the table may have been reset: start again "
                     "at 0)",
                     (unsigned long long)m->cursor, (unsigned long long)rows->next_row,
                     ts_stable_name(t), srv->shard);
    ts_session_reply_error(s, TS_MSG_TABLE_KEYS, m->request_id, TS_EINVAL, err);
    return;
  }
  /* Never more keys than the table has rows: a page of a small table costs it, not 8 MiB. */
  uint64_t max = m->max_keys < rows->size ? m->max_keys : rows->size;
  size_t bytes = (size_t)max * sizeof(uint64_t);
  keys_buf_t *kb = ts_malloc(sizeof *kb + bytes);
  if (!kb) {
    ts_session_reply_error(s, TS_MSG_TABLE_KEYS, m->request_id, TS_ENOMEM,
                           "out of memory for a table keys reply");
    return;
  }
  uint64_t cursor = m->cursor;
  uint64_t slots =
      m->max_keys * SLOTS_PER_KEY > MIN_SLOTS ? m->max_keys * SLOTS_PER_KEY : MIN_SLOTS;
  /* A table whose rows were all erased still has their slots: nothing left to list. */
  size_t n = 0;
  if (rows->size == 0)
    cursor = rows->next_row;
  else
    n = ts_table_keys(rows, &cursor, kb->keys, (size_t)max, slots);
  bytes = n * sizeof(uint64_t);
  kb->charged = ts_alloc_cost(sizeof *kb + (size_t)max * sizeof(uint64_t));
  Tessera__TableKeysReply r = TESSERA__TABLE_KEYS_REPLY__INIT;
  r.request_id = m->request_id;
  r.table = m->table;
  r.num_keys = n;
  r.next_cursor = cursor;
  r.done = cursor >= rows->next_row;
  r.erased = rows->erased;
  r.rows = rows->size;
  uv_buf_t b = uv_buf_init((char *)kb->keys, (unsigned)bytes);
  ts_conn_charge(&s->conn, (int64_t)kb->charged);
  int rc = ts_conn_send(&s->conn, TS_MSG_TABLE_KEYS_REPLY, &r.base, &b, bytes ? 1 : 0, on_sent, kb);
  if (rc < 0) {
    ts_conn_charge(&s->conn, -(int64_t)kb->charged);
    ts_free(kb);
    ts_session_reply_failed(s, TS_MSG_TABLE_KEYS_REPLY, rc);
    return;
  }
  ts_replyq_enforce(srv);
}

void ts_table_keys_handle(ts_session_t *s, Tessera__TableKeys *m) {
  handle(s, m);
  ts_msg_free(&m->base);
}
