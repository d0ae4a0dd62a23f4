/*
 * fake-shard: a hostile peer on a shard's address, for the tests that prove a client cannot
 * be made to return an unknown error code or print a control byte (docs/security.md).
 *
 * It speaks the real wire format (proto/): a Hello, then the handshake's reply, then for
 * every request an Error with code -3 (ESRCH, not one of Tessera's) and a detail full of
 * terminal escapes; a Status request is answered with a ShardStatus whose worker identity
 * and device, table name and checkpoint path carry the same bytes. With --handshake-error
 * the handshake itself is answered with that Error. No token: what it tests comes before
 * any proof of the token (a shard that proves it is the mutual-authentication work's).
 *
 * With --misbehave it takes the handshake and a Declare, then answers a SparsePull with a
 * SparsePushReply of the pull's id (a reply of another type), and a SparsePush as soon as
 * its meta is in, before reading its payload (an answer to a request it did not read; a
 * payload over 8 MiB is left unread for a second, so the client is still sending it).
 *
 *   fake-shard [--handshake-error | --misbehave]   prints its port on stdout, serves until
 *                                                   killed
 *
 * Each connection is served by a child process that dies with its parent.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "rawconn.h"
#include "ts_frame.h"

/* ESC sequences (set the window title, clear the screen, red), BEL, a line break that
 * would forge a log line, an 8-bit CSI as UTF-8, a byte that is not UTF-8. */
#define EVIL "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x07\r\nforged: line \xc2\x9b" "1m \xff end"
#define EVIL_CODE (-3)

static uint64_t request_id_of(uint16_t type, const uint8_t *meta, uint32_t len) {
  const ProtobufCMessageDescriptor *d = ts_msg_descriptor(type);
  if (!d) return 0;
  ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, len, meta);
  if (!m) return 0;
  uint64_t id = 0;
  const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(d, "request_id");
  if (f && f->type == PROTOBUF_C_TYPE_UINT64) memcpy(&id, (char *)m + f->offset, sizeof id);
  protobuf_c_message_free_unpacked(m, NULL);
  return id;
}

static void send_error(int fd, uint64_t request_id) {
  Tessera__Error e = TESSERA__ERROR__INIT;
  e.request_id = request_id;
  e.code = EVIL_CODE;
  e.name = "ESRCH\x1b[5m";
  e.detail = EVIL;
  ts_raw_send_msg(fd, TS_MSG_ERROR, &e.base, 0);
}

static void send_status(int fd, uint64_t request_id) {
  Tessera__WorkerStatus w = TESSERA__WORKER_STATUS__INIT, *wp = &w;
  w.task = 0;
  w.step = 7;
  w.alive = true;
  w.reported = w.step_known = true;
  w.identity = "worker " EVIL;
  w.device = "/gpu:0" EVIL;
  Tessera__TableStatus t = TESSERA__TABLE_STATUS__INIT, *tp = &t;
  t.name = "table" EVIL;
  t.dim = 4;
  Tessera__ShardStatus s = TESSERA__SHARD_STATUS__INIT;
  s.request_id = request_id;
  s.num_shards = 1;
  s.mode = TESSERA__MODE__MODE_ASYNC;
  s.num_workers = 1;
  s.workers = &wp;
  s.n_workers = 1;
  s.tables = &tp;
  s.n_tables = 1;
  s.last_checkpoint = "/ckpt" EVIL;
  s.last_checkpoint_age_s = -1;
  ts_raw_send_msg(fd, TS_MSG_STATUS_REPLY, &s.base, 0);
}

static void send_hello(int fd, const char *server_id) {
  uint8_t nonce[32] = {0};
  Tessera__Hello h = TESSERA__HELLO__INIT;
  h.protocol = TS_PROTOCOL_VERSION;
  h.num_shards = 1;
  h.nonce.data = nonce;
  h.nonce.len = sizeof nonce;
  h.server_id = (char *)server_id;
  h.incarnation = 1;
  ts_raw_send_msg(fd, TS_MSG_HELLO, &h.base, 0);
}

static void send_handshake_reply(int fd, uint64_t request_id) {
  Tessera__HandshakeReply r = TESSERA__HANDSHAKE_REPLY__INIT;
  r.request_id = request_id;
  r.num_shards = 1;
  r.mode = TESSERA__MODE__MODE_ASYNC;
  r.partition_bytes = 4 << 20;
  r.num_workers = 1;
  ts_raw_send_msg(fd, TS_MSG_HANDSHAKE_REPLY, &r.base, 0);
}

static void serve(int fd, bool handshake_error) {
  send_hello(fd, "fake-shard" EVIL);
  uint8_t meta[4096];
  uint32_t len;
  int type;
  /* ts_raw_read_frame gives up after 5 s of silence: loop until the peer leaves. */
  while ((type = ts_raw_read_frame(fd, meta, &len)) >= 0 || !ts_raw_closed_by_peer(fd, 0)) {
    if (type < 0) continue;
    uint64_t id = request_id_of((uint16_t)type, meta, len);
    if (type == TS_MSG_HANDSHAKE && !handshake_error) {
      send_handshake_reply(fd, id);
      send_error(fd, 0); /* and an error no request asked for, which clients log */
    } else if (type == TS_MSG_STATUS) {
      send_status(fd, id);
    } else {
      send_error(fd, id);
      if (type == TS_MSG_HANDSHAKE) break; /* as a shard closes after refusing a handshake */
    }
  }
}

static void reply_push(int fd, uint64_t id) {
  Tessera__SparsePushReply r = TESSERA__SPARSE_PUSH_REPLY__INIT;
  r.request_id = id;
  r.result = TESSERA__PUSH_RESULT__PUSH_APPLIED;
  ts_raw_send_msg(fd, TS_MSG_SPARSE_PUSH_REPLY, &r.base, 0);
}

/* Read and drop n payload bytes; false when the peer left. */
static bool skip(int fd, uint64_t n) {
  static uint8_t buf[1 << 16];
  for (; n; ) {
    size_t k = n < sizeof buf ? (size_t)n : sizeof buf;
    if (ts_raw_read_full(fd, buf, k, 5000) < 0) return false;
    n -= k;
  }
  return true;
}

static void serve_misbehaving(int fd) {
  send_hello(fd, "fake-shard");
  static uint8_t meta[1 << 20];
  for (;;) {
    uint8_t hdr[TS_FRAME_HEADER_SIZE];
    ts_frame_header_t fh;
    if (ts_raw_read_full(fd, hdr, sizeof hdr, 5000) < 0) {
      if (ts_raw_closed_by_peer(fd, 0)) return;
      continue;
    }
    if (ts_frame_decode_header(hdr, sizeof hdr, UINT64_C(1) << 40, &fh, NULL) !=
            TS_FRAME_HEADER_SIZE ||
        fh.meta_len > sizeof meta ||
        ts_raw_read_full(fd, meta, fh.meta_len, 5000) < 0)
      return;
    uint64_t id = request_id_of(fh.type, meta, fh.meta_len);
    if (fh.type == TS_MSG_HANDSHAKE) {
      send_handshake_reply(fd, id);
    } else if (fh.type == TS_MSG_DECLARE) {
      Tessera__DeclareReply r = TESSERA__DECLARE_REPLY__INIT;
      r.request_id = id;
      r.created = true;
      ts_raw_send_msg(fd, TS_MSG_DECLARE_REPLY, &r.base, 0);
    } else if (fh.type == TS_MSG_SPARSE_PULL || fh.type == TS_MSG_SPARSE_PUSH) {
      reply_push(fd, id); /* a pull answered as a push; a push before it is read */
      if (fh.type == TS_MSG_SPARSE_PUSH && fh.data_len > (8u << 20)) sleep(1); /* unread */
    } else if (fh.type != TS_MSG_HEARTBEAT) {
      send_error(fd, id);
    }
    if (!skip(fd, fh.data_len)) return;
  }
}

int main(int argc, char **argv) {
  bool handshake_error = argc > 1 && strcmp(argv[1], "--handshake-error") == 0;
  bool misbehave = argc > 1 && strcmp(argv[1], "--misbehave") == 0;
  signal(SIGCHLD, SIG_IGN); /* children are reaped by the kernel */
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t alen = sizeof a;
  if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) < 0 || listen(ls, 64) < 0 ||
      getsockname(ls, (struct sockaddr *)&a, &alen) < 0) {
    perror("fake-shard: listen");
    return 1;
  }
  printf("%d\n", ntohs(a.sin_port));
  fflush(stdout);
  pid_t parent = getpid();
  for (;;) {
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) continue;
    pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(0);
      close(ls);
      if (misbehave)
        serve_misbehaving(fd);
      else
        serve(fd, handshake_error);
      _exit(0);
    }
    close(fd);
  }
}
