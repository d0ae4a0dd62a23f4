/*
 * TLS 1.3 for shard connections (auth.tls, docs/security.md), with OpenSSL.
 *
 * A context holds what one side brings: its certificate chain and key, and the CA that signs
 * the other side's. Both sides verify: the client checks the shard's certificate against the
 * CA and the shard's address (an IP address or a DNS name in the certificate's
 * subjectAltName), the shard asks every client for a certificate from the same CA (mutual
 * TLS, as etcd's client-cert-auth). TLS 1.3 only, no session tickets (connections live as
 * long as the job), no renegotiation.
 *
 * A connection's TLS runs over buffers, not the socket: ts_conn reads ciphertext with libuv,
 * lends it to ts_tls_feed, and takes plaintext out with ts_tls_read straight into the buffer
 * its frame state machine expects next; what ts_tls_write encrypts is taken out whole with
 * ts_tls_take_output and written with libuv. Nothing here does I/O or blocks.
 */
#ifndef TS_TLS_H
#define TS_TLS_H

#include <stdbool.h>
#include <stddef.h>

typedef struct ts_tls_ctx ts_tls_ctx_t;
typedef struct ts_tls ts_tls_t;

typedef struct {
  const char *ca_file;   /* PEM: the CA (or CAs) that sign the other side's certificate */
  const char *cert_file; /* PEM: this side's certificate, then its chain */
  const char *key_file;  /* PEM: this side's private key */
} ts_tls_files_t;

/* Load a context for a shard (server = true) or a client. Returns 0, or TS_ECONFIG with
 * errmsg naming the file and why (unreadable, not PEM, key and certificate that do not
 * match). A certificate that is expired or not valid yet loads, with a warning in the log
 * naming the date: the other side refuses it. */
int ts_tls_ctx_new(ts_tls_ctx_t **out, const ts_tls_files_t *files, bool server, char *errmsg,
                   size_t errlen);
void ts_tls_ctx_free(ts_tls_ctx_t *ctx);

/* A connection's TLS. peer_host: for a client, the host part of the shard's address the
 * certificate must name (NULL: the chain is checked, not the name); ignored for a shard.
 * NULL when out of memory. */
ts_tls_t *ts_tls_new(ts_tls_ctx_t *ctx, const char *peer_host);
void ts_tls_free(ts_tls_t *t);

/* Lend n bytes of ciphertext read from the peer: they stay in place, and the caller's
 * memory unchanged, until ts_tls_input says all are read (the handshake or ts_tls_read
 * reads them). 0, or TS_EINVAL while the last bytes lent are not all read. */
int ts_tls_feed(ts_tls_t *t, const void *bytes, size_t n);
size_t ts_tls_input(const ts_tls_t *t); /* bytes lent not read yet */

/* Go on with the handshake: 1 when it is done, 0 when it needs more bytes from the peer,
 * TS_EAUTH when it failed (ts_tls_errmsg says why: the certificate check that failed, or the
 * peer's alert). Take the output afterwards, also after a failure (it may be an alert). */
int ts_tls_handshake(ts_tls_t *t);

/* After the handshake: decrypt up to n bytes into buf. Returns the bytes (> 0), 0 when more
 * ciphertext is needed, TS_ECLOSED when the peer closed the TLS session, TS_EAUTH for the
 * peer's fatal alert (a shard refusing this client's certificate), or TS_EPROTO (a record
 * that fails its check: the bytes were changed on the way). */
long ts_tls_read(ts_tls_t *t, void *buf, size_t n);

/* After the handshake: encrypt n bytes (all of them; the output grows). 0 or TS_ENOMEM. */
int ts_tls_write(ts_tls_t *t, const void *buf, size_t n);

/* Ciphertext waiting to be sent, and taking it: the buffer that holds it (ts_malloc'd, the
 * caller frees it with ts_free) and its length in *len; NULL with *len 0 when none. */
size_t ts_tls_output(const ts_tls_t *t);
void *ts_tls_take_output(ts_tls_t *t, size_t *len);

/* True for a shard's side. */
bool ts_tls_server(const ts_tls_t *t);

/* Why the last call failed (text-safe, empty when none). */
const char *ts_tls_errmsg(const ts_tls_t *t);

#endif
