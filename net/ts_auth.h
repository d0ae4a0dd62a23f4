/*
 * Shared-secret authentication of the handshake (docs/architecture.md), with libsodium.
 *
 * The server sends a random nonce in Hello; the client answers with
 * HMAC-SHA256(token, nonce); the server recomputes it and compares in constant time. The
 * token never travels. Tokens live in files (auth.token_file, auth.admin_token_file).
 *
 * Two more keys come from the same token (docs/security.md):
 *   task key   HMAC-SHA256(token, "worker/T") in lower-case hex: a worker that handshakes
 *              with it instead of the token proves it is task T (`psctl token derive`).
 *   shard proof  the handshake reply's HMAC-SHA256(key, "tessera shard proof" (19 bytes,
 *              no terminating 0) || server nonce || client nonce) with the key the client
 *              used: the shard proves it knows the token, so a client refuses anything else
 *              answering on its address. tests/unit/test_auth_keys.c has known answers.
 */
#ifndef TS_AUTH_H
#define TS_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define TS_AUTH_NONCE_LEN 32
#define TS_AUTH_MAC_LEN 32
#define TS_AUTH_MIN_TOKEN 16
#define TS_AUTH_TASK_KEY_LEN 64 /* hex characters, without the terminating 0 */

/* The value deploy/k8s/configmap.yaml's Secret ships with, to be replaced before use: a
 * token file that holds it is refused, so that a cluster never runs on a secret printed
 * in the repository (tests/deploy/check_k8s.py checks that the two agree). */
#define TS_AUTH_PLACEHOLDER_TOKEN "replace-me-with-openssl-rand-hex-32-output"

/* Read a token file: its content without trailing whitespace, at least TS_AUTH_MIN_TOKEN
 * bytes and not TS_AUTH_PLACEHOLDER_TOKEN. Returns a string to free with
 * ts_auth_free_token, or NULL with errmsg set. */
char *ts_auth_read_token(const char *path, char *errmsg, size_t errlen);

/* Wipe and free a token (NULL is fine). */
void ts_auth_free_token(char *token);

/* out = HMAC-SHA256(token, nonce[0..len)). */
void ts_auth_mac(const char *token, const uint8_t *nonce, size_t len, uint8_t out[TS_AUTH_MAC_LEN]);

/* 0 when mac is HMAC-SHA256(token, nonce), compared in constant time; TS_EAUTH otherwise. */
int ts_auth_verify(const char *token, const uint8_t *nonce, size_t len, const uint8_t *mac,
                   size_t mac_len);

/* out = the task key of `task` under token: 64 hex characters and a 0. */
void ts_auth_task_key(const char *token, int task, char out[TS_AUTH_TASK_KEY_LEN + 1]);

/* 0 when mac is HMAC-SHA256(task key of `task`, nonce); TS_EAUTH otherwise. */
int ts_auth_verify_task(const char *token, int task, const uint8_t *nonce, size_t len,
                        const uint8_t *mac, size_t mac_len);

/* out = the shard's proof of key over both nonces (TS_AUTH_NONCE_LEN bytes each). */
void ts_auth_proof(const char *key, const uint8_t *server_nonce, const uint8_t *client_nonce,
                   uint8_t out[TS_AUTH_MAC_LEN]);

/* 0 when proof is ts_auth_proof(key, ...), compared in constant time; TS_EAUTH otherwise. */
int ts_auth_verify_proof(const char *key, const uint8_t *server_nonce, const uint8_t *client_nonce,
                         const uint8_t *proof, size_t proof_len);

#endif
