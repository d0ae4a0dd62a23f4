/* A framed connection (net/ts_conn.h) on a loopback socket pair: a frame sent in groups
 * reports every payload buffer once, never from inside the sending call, and its final
 * call last, also when queuing a group fails half way (the owner frees its state on the
 * final call); the write stall counts bytes moving, not whole requests completing; the
 * memory of queued writes is counted and given back; a frame's age and bytes are
 * measured from its first byte; a meta over max_meta is refused before anything is
 * allocated for it; frames that come in together (read ahead in one read) are handed on
 * in order, their payloads whole, and nothing after a held frame is handed on before it
 * resumes; the replies made meanwhile go out in order, the small ones held back to share
 * a write with the next; and the same for a random stream of frames written in chunks of
 * random sizes, with holds at the meta and after a piece at random. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include <cmocka.h>

#include "ts_alloc.h"
#include "ts_conn.h"
#include "ts_err.h"

#define NBUF 4
#define BUF_BYTES ((size_t)1 << 20) /* one group per buffer */

typedef struct {
  uv_loop_t loop;
  uv_tcp_t listener, peer; /* the peer accepts and never reads */
  bool accepted;
  ts_conn_t conn;
  uv_connect_t connect;
  bool connected;
  bool closed;
  /* parts callbacks */
  bool in_send; /* inside ts_conn_send_parts */
  int calls, calls_in_send, calls_after_last;
  bool got_last;
  int reported[NBUF]; /* times each buffer was reported */
} fixture_t;

static int on_meta(ts_conn_t *c, const ts_frame_header_t *h, ProtobufCMessage *msg,
                   const uv_buf_t **iov, unsigned *niov) {
  (void)c, (void)h, (void)msg, (void)iov, (void)niov;
  return 0;
}

static void on_frame(ts_conn_t *c, const ts_frame_header_t *h, ProtobufCMessage *msg,
                     bool discarded) {
  (void)c, (void)h, (void)discarded;
  ts_msg_free(msg);
}

static void on_conn_close(ts_conn_t *c, int err) {
  (void)err;
  fixture_t *f = c->data;
  f->closed = true;
}

static const ts_conn_cbs_t cbs = {
    .on_meta = on_meta, .on_frame = on_frame, .on_close = on_conn_close};

static void on_accept(uv_stream_t *s, int status) {
  fixture_t *f = s->data;
  assert_int_equal(status, 0);
  uv_tcp_init(&f->loop, &f->peer);
  assert_int_equal(uv_accept(s, (uv_stream_t *)&f->peer), 0);
  f->accepted = true;
}

static void on_connect(uv_connect_t *req, int status) {
  fixture_t *f = req->data;
  assert_int_equal(status, 0);
  f->connected = true;
}

static int setup(void **state) {
  fixture_t *f = calloc(1, sizeof *f);
  assert_int_equal(uv_loop_init(&f->loop), 0);
  uv_tcp_init(&f->loop, &f->listener);
  f->listener.data = f;
  struct sockaddr_in a;
  uv_ip4_addr("127.0.0.1", 0, &a);
  assert_int_equal(uv_tcp_bind(&f->listener, (const struct sockaddr *)&a, 0), 0);
  assert_int_equal(uv_listen((uv_stream_t *)&f->listener, 4, on_accept), 0);
  int len = sizeof a;
  uv_tcp_getsockname(&f->listener, (struct sockaddr *)&a, &len);
  assert_int_equal(ts_conn_init(&f->loop, &f->conn, &cbs, 1 << 20, f), 0);
  f->connect.data = f;
  assert_int_equal(
      uv_tcp_connect(&f->connect, &f->conn.handle, (const struct sockaddr *)&a, on_connect), 0);
  while (!f->connected || !f->accepted) uv_run(&f->loop, UV_RUN_ONCE);
  assert_int_equal(ts_conn_start(&f->conn), 0);
  /* Small socket buffers, so most of the frame stays queued. */
  int size = 64 << 10;
  uv_send_buffer_size((uv_handle_t *)&f->conn.handle, &size);
  *state = f;
  return 0;
}

static void on_closed_noop(uv_handle_t *h) {
  (void)h;
}

static int teardown(void **state) {
  fixture_t *f = *state;
  ts_conn_close(&f->conn, 0);
  uv_close((uv_handle_t *)&f->peer, on_closed_noop);
  uv_close((uv_handle_t *)&f->listener, on_closed_noop);
  uv_run(&f->loop, UV_RUN_DEFAULT);
  assert_true(f->closed);
  assert_int_equal(uv_loop_close(&f->loop), 0);
  free(f);
  return 0;
}

static void on_parts(ts_conn_t *c, void *arg, unsigned first, unsigned n, bool last, int err) {
  (void)c, (void)err;
  fixture_t *f = arg;
  f->calls++;
  if (f->in_send) f->calls_in_send++;
  if (f->got_last) f->calls_after_last++;
  for (unsigned i = first; i < first + n && i < NBUF; i++) f->reported[i]++;
  if (last) f->got_last = true;
}

static uv_buf_t *payload(char **mem) {
  static uv_buf_t bufs[NBUF];
  *mem = calloc(NBUF, BUF_BYTES);
  for (unsigned i = 0; i < NBUF; i++) bufs[i] = uv_buf_init(*mem + i * BUF_BYTES, BUF_BYTES);
  return bufs;
}

static int send_parts(fixture_t *f, const uv_buf_t *bufs) {
  Tessera__PullReply r = TESSERA__PULL_REPLY__INIT;
  f->in_send = true;
  int rc = ts_conn_send_parts(&f->conn, TS_MSG_PULL_REPLY, &r.base, bufs, NBUF, on_parts, f);
  f->in_send = false;
  return rc;
}

/* Queuing the second group fails: the first is queued already, so the connection closes;
 * every buffer is still reported once, after the call, and the final call comes last. */
static void test_send_parts_fails_half_way(void **state) {
  fixture_t *f = *state;
  char *mem;
  const uv_buf_t *bufs = payload(&mem);
  ts_alloc_fail_after(2); /* the first request (header, meta, first group) is allocated */
  int rc = send_parts(f, bufs);
  ts_alloc_fail_after(0);
  assert_int_equal(rc, 0);
  assert_int_equal(f->calls_in_send, 0);
  assert_true(f->conn.closing);
  while (!f->closed) uv_run(&f->loop, UV_RUN_ONCE);
  assert_true(f->got_last);
  assert_int_equal(f->calls_after_last, 0);
  for (unsigned i = 0; i < NBUF; i++) assert_int_equal(f->reported[i], 1);
  free(mem);
}

/* The first request cannot be allocated: an error and no callback (libuv's rule). */
static void test_send_parts_fails_first(void **state) {
  fixture_t *f = *state;
  char *mem;
  const uv_buf_t *bufs = payload(&mem);
  ts_alloc_fail_after(1);
  int rc = send_parts(f, bufs);
  ts_alloc_fail_after(0);
  assert_int_equal(rc, TS_ENOMEM);
  assert_int_equal(f->calls, 0);
  assert_false(f->conn.closing);
  free(mem);
}

/* While the peer reads nothing the stall grows; bytes it reads count as progress, even
 * before any one write request completes. */
static void test_write_stall_counts_bytes(void **state) {
  fixture_t *f = *state;
  char *mem;
  const uv_buf_t *bufs = payload(&mem);
  /* One request of all four buffers (4 MiB) that the peer drains slowly. */
  Tessera__PullReply r = TESSERA__PULL_REPLY__INIT;
  uv_update_time(&f->loop);
  uint64_t t0 = uv_now(&f->loop);
  assert_int_equal(ts_conn_send(&f->conn, TS_MSG_PULL_REPLY, &r.base, bufs, NBUF, NULL, NULL), 0);
  assert_true(ts_conn_write_queue(&f->conn) > 0);
  assert_int_equal(ts_conn_write_stall_ms(&f->conn, t0), 0);
  assert_int_equal(ts_conn_write_stall_ms(&f->conn, t0 + 1000), 1000);
  /* The peer reads some: the next look sees progress. */
  int fd;
  assert_int_equal(uv_fileno((uv_handle_t *)&f->peer, &fd), 0);
  static char junk[256 << 10];
  size_t before = ts_conn_write_queue(&f->conn);
  for (int i = 0; i < 100 && ts_conn_write_queue(&f->conn) == before; i++) {
    (void)!read(fd, junk, sizeof junk);
    uv_run(&f->loop, UV_RUN_NOWAIT);
  }
  assert_true(ts_conn_write_queue(&f->conn) < before);
  assert_int_equal(ts_conn_write_stall_ms(&f->conn, t0 + 2000), 0);
  assert_int_equal(ts_conn_write_stall_ms(&f->conn, t0 + 2500), 500);
  ts_conn_close(&f->conn, 0);
  while (!f->closed) uv_run(&f->loop, UV_RUN_ONCE);
  free(mem);
}

/* Every queued request is charged to write_mem (and the owner's total) with at least its
 * struct and frame, and gives it back once written, or cancelled by a close. */
static void test_write_memory_is_counted(void **state) {
  fixture_t *f = *state;
  uint64_t total = 0;
  f->conn.write_mem_total = &total;
  Tessera__Heartbeat hb = TESSERA__HEARTBEAT__INIT;
  for (int i = 0; i < 10; i++)
    assert_int_equal(ts_conn_send(&f->conn, TS_MSG_HEARTBEAT, &hb.base, NULL, 0, NULL, NULL), 0);
  assert_true(f->conn.write_mem >= 10 * (sizeof(uv_write_t) + TS_FRAME_HEADER_SIZE));
  assert_int_equal(total, f->conn.write_mem);
  ts_conn_charge(&f->conn, 1000);
  assert_int_equal(total, f->conn.write_mem);
  ts_conn_charge(&f->conn, -1000);
  /* A few bytes the kernel takes at once: each request gives its memory back. */
  for (int i = 0; i < 100 && f->conn.write_mem; i++) uv_run(&f->loop, UV_RUN_NOWAIT);
  assert_int_equal(f->conn.write_mem, 0);
  assert_int_equal(total, 0);
  /* A large frame the peer does not read stays charged until the close cancels it. */
  char *mem;
  const uv_buf_t *bufs = payload(&mem);
  assert_int_equal(send_parts(f, bufs), 0);
  assert_true(f->conn.write_mem > 0);
  ts_conn_close(&f->conn, 0);
  while (!f->closed) uv_run(&f->loop, UV_RUN_ONCE);
  assert_int_equal(f->conn.write_mem, 0);
  assert_int_equal(total, 0);
  free(mem);
}

/* Write n bytes to the conn from the peer's side and let the loop read them. */
static void peer_sends(fixture_t *f, const void *buf, size_t n) {
  int fd;
  assert_int_equal(uv_fileno((uv_handle_t *)&f->peer, &fd), 0);
  assert_int_equal(write(fd, buf, n), (ssize_t)n);
  uint64_t before = f->conn.bytes_in;
  for (int i = 0; i < 1000 && f->conn.bytes_in < before + n && !f->closed; i++)
    uv_run(&f->loop, UV_RUN_NOWAIT);
}

static void test_frame_age(void **state) {
  fixture_t *f = *state;
  Tessera__Status st = TESSERA__STATUS__INIT;
  st.request_id = 77;
  uint8_t frame[64];
  size_t n = ts_msg_encode(TS_MSG_STATUS, &st.base, 0, frame);
  assert_true(n > TS_FRAME_HEADER_SIZE + 1);
  uv_update_time(&f->loop);
  uint64_t t0 = uv_now(&f->loop);
  assert_int_equal(ts_conn_frame_age_ms(&f->conn, t0 + 5000), 0); /* between frames */
  peer_sends(f, frame, TS_FRAME_HEADER_SIZE + 1);
  assert_int_equal(f->conn.frame_bytes, TS_FRAME_HEADER_SIZE + 1);
  uint64_t mark = f->conn.frame_mark_ms;
  assert_int_equal(ts_conn_frame_age_ms(&f->conn, mark + 1500), 1500);
  peer_sends(f, frame + TS_FRAME_HEADER_SIZE + 1, n - TS_FRAME_HEADER_SIZE - 1);
  assert_int_equal(f->conn.frames_in, 1);
  assert_int_equal(ts_conn_frame_age_ms(&f->conn, mark + 1500), 0); /* done */
}

static void test_meta_over_limit(void **state) {
  fixture_t *f = *state;
  f->conn.max_meta = 64;
  uint8_t h[TS_FRAME_HEADER_SIZE];
  ts_frame_encode_header(h, TS_MSG_HANDSHAKE, TS_FRAME_MAX_META, 0);
  peer_sends(f, h, sizeof h);
  for (int i = 0; i < 1000 && !f->closed; i++) uv_run(&f->loop, UV_RUN_NOWAIT);
  assert_true(f->closed);
  assert_int_equal(f->conn.close_err, TS_ETOOBIG);
  assert_int_equal(f->conn.meta_cap, 0); /* nothing was allocated for it */
}

/* --- read-ahead ----------------------------------------------------------------------- */

#define RA_FLOATS 1024 /* a 4 KiB push: with the frames around it, past the 8 KiB read-ahead */
#define RA_FRAMES 4

typedef struct {
  int held;                 /* on_meta calls that returned TS_CONN_HOLD */
  int n;                    /* frames handed on */
  uint64_t ids[RA_FRAMES];  /* their request ids, in order */
  float data[2][RA_FLOATS]; /* the two pushes' payloads */
  uv_buf_t iov[2][2];
} ra_t;

static ra_t ra_state;

static int ra_on_meta(ts_conn_t *c, const ts_frame_header_t *h, ProtobufCMessage *msg,
                      const uv_buf_t **iov, unsigned *niov) {
  (void)c;
  if (h->type != TS_MSG_PUSH) return 0;
  uint64_t id = ((Tessera__Push *)msg)->request_id;
  int k = id == 1 ? 0 : 1;
  /* Two pieces per payload: a piece boundary inside the read-ahead too. */
  ra_state.iov[k][0] = uv_buf_init((char *)ra_state.data[k], RA_FLOATS * 2);
  ra_state.iov[k][1] = uv_buf_init((char *)ra_state.data[k] + RA_FLOATS * 2, RA_FLOATS * 2);
  *iov = ra_state.iov[k];
  *niov = 2;
  if (id == 1) {
    ra_state.held++;
    return TS_CONN_HOLD; /* the first push waits (as for a staging buffer) */
  }
  return 0;
}

static void ra_on_frame(ts_conn_t *c, const ts_frame_header_t *h, ProtobufCMessage *msg,
                        bool discarded) {
  (void)c;
  assert_false(discarded);
  assert_true(ra_state.n < RA_FRAMES);
  ra_state.ids[ra_state.n++] = h->type == TS_MSG_PUSH ? ((Tessera__Push *)msg)->request_id
                                                      : ((Tessera__Status *)msg)->request_id;
  ts_msg_free(msg);
}

static const ts_conn_cbs_t ra_cbs = {
    .on_meta = ra_on_meta, .on_frame = ra_on_frame, .on_close = on_conn_close};

/* Append a frame to out at *len: a push of `floats` floats v, v + 1, ..., or (v < 0) a status
 * request. */
static void ra_frame(uint8_t *out, size_t *len, uint64_t id, float v, size_t floats) {
  if (v < 0) {
    Tessera__Status st = TESSERA__STATUS__INIT;
    st.request_id = id;
    *len += ts_msg_encode(TS_MSG_STATUS, &st.base, 0, out + *len);
    return;
  }
  Tessera__PartSlice sl = TESSERA__PART_SLICE__INIT;
  sl.count = floats;
  Tessera__PartSlice *slices[] = {&sl};
  Tessera__Push m = TESSERA__PUSH__INIT;
  m.request_id = id;
  m.n_parts = 1;
  m.parts = slices;
  *len += ts_msg_encode(TS_MSG_PUSH, &m.base, floats * sizeof(float), out + *len);
  for (size_t i = 0; i < floats; i++) {
    float x = v + (float)i;
    memcpy(out + *len + i * sizeof x, &x, sizeof x);
  }
  *len += floats * sizeof(float);
}

static void test_read_ahead_in_order(void **state) {
  fixture_t *f = *state;
  memset(&ra_state, 0, sizeof ra_state);
  f->conn.cbs = &ra_cbs;
  static uint8_t wire[4 * RA_FLOATS * sizeof(float)];
  size_t len = 0;
  ra_frame(wire, &len, 1, 1000.0f, RA_FLOATS); /* push, held at its meta */
  ra_frame(wire, &len, 2, -1.0f, 0);           /* status */
  ra_frame(wire, &len, 3, 5000.0f, RA_FLOATS); /* push */
  ra_frame(wire, &len, 4, -1.0f, 0);           /* status */
  assert_true(len > 8 * 1024);                 /* more than one read-ahead */
  peer_sends(f, wire, len);
  for (int i = 0; i < 200; i++) uv_run(&f->loop, UV_RUN_NOWAIT);
  /* Held at the first push's meta: nothing after it is handed on meanwhile. */
  assert_int_equal(ra_state.held, 1);
  assert_int_equal(ra_state.n, 0);
  assert_true(f->conn.held);
  assert_true(f->conn.ra_off < f->conn.ra_len); /* the rest waits in the read-ahead */
  ts_conn_resume(&f->conn);
  for (int i = 0; i < 1000 && ra_state.n < RA_FRAMES; i++) uv_run(&f->loop, UV_RUN_NOWAIT);
  assert_int_equal(ra_state.n, RA_FRAMES);
  for (int i = 0; i < RA_FRAMES; i++) assert_int_equal(ra_state.ids[i], (uint64_t)i + 1);
  for (size_t i = 0; i < RA_FLOATS; i++) {
    assert_true(ra_state.data[0][i] == 1000.0f + (float)i);
    assert_true(ra_state.data[1][i] == 5000.0f + (float)i);
  }
  assert_false(f->closed);
  assert_int_equal(f->conn.frames_in, RA_FRAMES);
}

/* The peer reads the want bytes the conn sent into in. */
static void peer_reads(fixture_t *f, uint8_t *in, size_t want) {
  int fd;
  assert_int_equal(uv_fileno((uv_handle_t *)&f->peer, &fd), 0);
  size_t got = 0;
  for (int i = 0; i < 100000 && got < want; i++) {
    ssize_t r = read(fd, in + got, want - got);
    if (r > 0) got += (size_t)r;
  }
  assert_int_equal(got, want);
}

/* The reply at *off of in[0, got) (a status or a push): its request id and payload bytes;
 * *off moves past it. */
static uint64_t next_reply(const uint8_t *in, size_t got, size_t *off, uint64_t *data_len) {
  ts_frame_header_t h;
  const char *why = NULL;
  assert_true(*off + TS_FRAME_HEADER_SIZE <= got);
  assert_int_equal(ts_frame_decode_header(in + *off, TS_FRAME_HEADER_SIZE, 1 << 20, &h, &why),
                   TS_FRAME_HEADER_SIZE);
  *off += TS_FRAME_HEADER_SIZE;
  ProtobufCMessage *m = NULL;
  char err[128];
  assert_int_equal(ts_msg_decode(h.type, in + *off, h.meta_len, h.data_len, &m, err, sizeof err),
                   0);
  uint64_t id =
      h.type == TS_MSG_PUSH ? ((Tessera__Push *)m)->request_id : ((Tessera__Status *)m)->request_id;
  ts_msg_free(m);
  *off += h.meta_len + h.data_len;
  *data_len = h.data_len;
  return id;
}

/* Replies made while frames read ahead are handed on: a payload-less one is held back
 * (cork) and goes out in front of the next frame sent, or alone once the read-ahead is
 * used up; the peer gets every reply, in order, and frames_out counts each. */
static void cork_on_frame(ts_conn_t *c, const ts_frame_header_t *h, ProtobufCMessage *msg,
                          bool discarded) {
  (void)h, (void)discarded;
  uint64_t id = ((Tessera__Status *)msg)->request_id;
  ts_msg_free(msg);
  ra_state.ids[ra_state.n++] = id;
  if (id == 2) { /* a reply with a payload: the held-back reply of 1 goes in front of it */
    static float four[4] = {1, 2, 3, 4};
    Tessera__PartSlice sl = TESSERA__PART_SLICE__INIT;
    sl.count = 4;
    Tessera__PartSlice *slices[] = {&sl};
    Tessera__Push m = TESSERA__PUSH__INIT;
    m.request_id = id;
    m.n_parts = 1;
    m.parts = slices;
    uv_buf_t b = uv_buf_init((char *)four, sizeof four);
    assert_int_equal(ts_conn_send(c, TS_MSG_PUSH, &m.base, &b, 1, NULL, NULL), 0);
    return;
  }
  Tessera__Status st = TESSERA__STATUS__INIT;
  st.request_id = id;
  assert_int_equal(ts_conn_send(c, TS_MSG_STATUS, &st.base, NULL, 0, NULL, NULL), 0);
  assert_true(c->cork_len > 0); /* held back: more frames wait in the read-ahead, or none */
}

static const ts_conn_cbs_t cork_cbs = {
    .on_meta = on_meta, .on_frame = cork_on_frame, .on_close = on_conn_close};

static void test_replies_while_reading_ahead(void **state) {
  fixture_t *f = *state;
  memset(&ra_state, 0, sizeof ra_state);
  f->conn.cbs = &cork_cbs;
  uint8_t wire[256];
  size_t len = 0;
  for (uint64_t id = 1; id <= 3; id++) ra_frame(wire, &len, id, -1.0f, 0);
  peer_sends(f, wire, len);
  for (int i = 0; i < 1000 && f->conn.frames_out < 3; i++) uv_run(&f->loop, UV_RUN_NOWAIT);
  assert_int_equal(ra_state.n, 3);
  assert_int_equal(f->conn.frames_out, 3);
  /* The peer reads them: 1 (status), 2 (push with 16 bytes), 3 (status). */
  uint8_t in[512];
  size_t got = (size_t)f->conn.bytes_out, off = 0;
  assert_true(got <= sizeof in);
  peer_reads(f, in, got);
  for (uint64_t id = 1; id <= 3; id++) {
    uint64_t data_len = 0;
    assert_int_equal(next_reply(in, got, &off, &data_len), id);
    assert_int_equal(data_len, id == 2 ? 16 : 0);
  }
  assert_int_equal(off, got);
}

/* --- read-ahead, randomised ------------------------------------------------------------ */

/* Frames of random kinds and sizes, written by the peer in chunks of random sizes (so frame,
 * header, meta and piece boundaries fall anywhere in and across the read-ahead), with holds
 * at the meta and after a piece at random; each frame answered with a payload-less reply
 * (held back while frames read ahead are handed on). Every frame arrives once, in order, its
 * payload whole, and the peer reads every reply, in order. */
#define FZ_FRAMES 300
#define FZ_MAX_FLOATS 3000 /* a push carries 1 .. FZ_MAX_FLOATS + 1 */

typedef struct {
  uint32_t rng;
  int n; /* frames handed on */
  int held_meta, held_piece;
  bool want_resume; /* a hold waits for the pump to resume it */
  uint64_t id;      /* the frame being read */
  uint32_t floats;  /* its payload */
  float data[FZ_MAX_FLOATS + 1];
  uv_buf_t iov[2];
  bool bad;
} fz_t;

static fz_t fz;

static uint32_t fz_next(uint32_t *s) {
  *s ^= *s << 13, *s ^= *s >> 17, *s ^= *s << 5;
  return *s;
}

static int fz_on_meta(ts_conn_t *c, const ts_frame_header_t *h, ProtobufCMessage *msg,
                      const uv_buf_t **iov, unsigned *niov) {
  (void)c;
  if (h->type != TS_MSG_PUSH) return 0;
  fz.id = ((Tessera__Push *)msg)->request_id;
  fz.floats = (uint32_t)(h->data_len / sizeof(float));
  memset(fz.data, 0xff, sizeof fz.data);
  size_t half = fz.floats / 2 * sizeof(float);
  fz.iov[0] = uv_buf_init((char *)fz.data, (unsigned)half);
  fz.iov[1] = uv_buf_init((char *)fz.data + half, (unsigned)(h->data_len - half));
  *iov = fz.iov;
  *niov = 2;
  if (fz_next(&fz.rng) % 4 == 0) {
    fz.held_meta++;
    fz.want_resume = true;
    return TS_CONN_HOLD;
  }
  return 0;
}

static int fz_on_piece(ts_conn_t *c, unsigned i) {
  (void)c, (void)i;
  if (fz_next(&fz.rng) % 4 == 0) {
    fz.held_piece++;
    fz.want_resume = true;
    return TS_CONN_HOLD;
  }
  return 0;
}

static void fz_on_frame(ts_conn_t *c, const ts_frame_header_t *h, ProtobufCMessage *msg,
                        bool discarded) {
  uint64_t id = h->type == TS_MSG_PUSH ? ((Tessera__Push *)msg)->request_id
                                       : ((Tessera__Status *)msg)->request_id;
  if (discarded || id != (uint64_t)fz.n + 1) fz.bad = true;
  if (h->type == TS_MSG_PUSH)
    for (uint32_t i = 0; i < fz.floats; i++)
      if (fz.data[i] != (float)id + (float)i) fz.bad = true;
  ts_msg_free(msg);
  fz.n++;
  Tessera__Status st = TESSERA__STATUS__INIT;
  st.request_id = id;
  if (ts_conn_send(c, TS_MSG_STATUS, &st.base, NULL, 0, NULL, NULL) < 0) fz.bad = true;
}

static const ts_conn_cbs_t fz_cbs = {.on_meta = fz_on_meta,
                                     .on_piece = fz_on_piece,
                                     .on_frame = fz_on_frame,
                                     .on_close = on_conn_close};

/* Let the loop run; resume a held frame now and then. */
static void fz_pump(fixture_t *f) {
  for (int i = 0; i < 4; i++) uv_run(&f->loop, UV_RUN_NOWAIT);
  if (fz.want_resume && fz_next(&fz.rng) % 2 == 0) {
    fz.want_resume = false;
    ts_conn_resume(&f->conn);
  }
}

static void test_read_ahead_random(void **state) {
  fixture_t *f = *state;
  memset(&fz, 0, sizeof fz);
  fz.rng = 12345;
  f->conn.cbs = &fz_cbs;
  size_t cap = FZ_FRAMES * (64 + (FZ_MAX_FLOATS + 1) * sizeof(float)), len = 0;
  uint8_t *wire = malloc(cap);
  assert_non_null(wire);
  for (uint64_t id = 1; id <= FZ_FRAMES; id++) {
    uint32_t kind = fz_next(&fz.rng) % 3;
    /* Status requests, mostly small pushes (a few in the read-ahead at once), some larger. */
    size_t floats = 1 + (kind == 1 ? fz_next(&fz.rng) % 64 : fz_next(&fz.rng) % FZ_MAX_FLOATS);
    ra_frame(wire, &len, id, kind == 0 ? -1.0f : (float)id, floats);
  }
  assert_true(len <= cap);
  int fd;
  assert_int_equal(uv_fileno((uv_handle_t *)&f->peer, &fd), 0);
  size_t off = 0;
  for (int spins = 0; off < len && spins < 200000 && !f->closed; spins++) {
    size_t chunk = 1 + fz_next(&fz.rng) % 10000;
    if (chunk > len - off) chunk = len - off;
    ssize_t w = write(fd, wire + off, chunk);
    if (w > 0) off += (size_t)w;
    fz_pump(f);
  }
  assert_int_equal(off, len);
  for (int i = 0; i < 200000 && fz.n < FZ_FRAMES && !f->closed; i++) {
    fz_pump(f);
    if (fz.want_resume) { /* nothing left to race with: resume at once */
      fz.want_resume = false;
      ts_conn_resume(&f->conn);
    }
  }
  assert_false(f->closed);
  assert_false(fz.bad);
  assert_int_equal(fz.n, FZ_FRAMES);
  assert_true(fz.held_meta > 0 && fz.held_piece > 0);
  for (int i = 0; i < 1000 && f->conn.frames_out < FZ_FRAMES; i++) uv_run(&f->loop, UV_RUN_NOWAIT);
  assert_int_equal(f->conn.frames_out, FZ_FRAMES);
  /* The peer reads the replies: one status per frame, in order. */
  size_t got = (size_t)f->conn.bytes_out, at = 0;
  uint8_t *in = malloc(got);
  assert_non_null(in);
  peer_reads(f, in, got);
  for (uint64_t id = 1; id <= FZ_FRAMES; id++) {
    uint64_t data_len = 0;
    assert_int_equal(next_reply(in, got, &at, &data_len), id);
    assert_int_equal(data_len, 0);
  }
  assert_int_equal(at, got);
  free(in);
  free(wire);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_send_parts_fails_first, setup, teardown),
      cmocka_unit_test_setup_teardown(test_send_parts_fails_half_way, setup, teardown),
      cmocka_unit_test_setup_teardown(test_write_stall_counts_bytes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_write_memory_is_counted, setup, teardown),
      cmocka_unit_test_setup_teardown(test_frame_age, setup, teardown),
      cmocka_unit_test_setup_teardown(test_meta_over_limit, setup, teardown),
      cmocka_unit_test_setup_teardown(test_read_ahead_in_order, setup, teardown),
      cmocka_unit_test_setup_teardown(test_replies_while_reading_ahead, setup, teardown),
      cmocka_unit_test_setup_teardown(test_read_ahead_random, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
