#include "ts_auth.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"

char *ts_auth_read_token(const char *path, char *errmsg, size_t errlen) {
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(errmsg, errlen, "cannot read token file %s: %s", path, strerror(errno));
    return NULL;
  }
  char buf[1024];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
    buf[--n] = 0;
  if (n < TS_AUTH_MIN_TOKEN) {
    snprintf(errmsg, errlen, "token file %s holds %zu bytes; a token needs at least %d", path, n,
             TS_AUTH_MIN_TOKEN);
    sodium_memzero(buf, sizeof buf);
    return NULL;
  }
  if (strcmp(buf, TS_AUTH_PLACEHOLDER_TOKEN) == 0) {
    snprintf(errmsg, errlen,
             "token file %s holds the placeholder '%s' of deploy/k8s/configmap.yaml, not a "
             "secret: put a token of your own there (openssl rand -hex 32)",
             path, TS_AUTH_PLACEHOLDER_TOKEN);
    return NULL;
  }
  char *t = ts_strdup(buf);
  sodium_memzero(buf, sizeof buf);
  if (!t) snprintf(errmsg, errlen, "out of memory");
  return t;
}

void ts_auth_free_token(char *token) {
  if (!token) return;
  sodium_memzero(token, strlen(token));
  ts_free(token);
}

void ts_auth_mac(const char *token, const uint8_t *nonce, size_t len, uint8_t out[TS_AUTH_MAC_LEN]) {
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, (const unsigned char *)token, strlen(token));
  crypto_auth_hmacsha256_update(&st, nonce, len);
  crypto_auth_hmacsha256_final(&st, out);
}

/* 0 when mac (mac_len bytes) is want, compared in constant time; TS_EAUTH otherwise. want
 * is wiped. */
static int same_mac(uint8_t want[TS_AUTH_MAC_LEN], const uint8_t *mac, size_t mac_len) {
  int ok = mac_len == TS_AUTH_MAC_LEN && sodium_memcmp(want, mac, TS_AUTH_MAC_LEN) == 0;
  sodium_memzero(want, TS_AUTH_MAC_LEN);
  return ok ? 0 : TS_EAUTH;
}

int ts_auth_verify(const char *token, const uint8_t *nonce, size_t len, const uint8_t *mac,
                   size_t mac_len) {
  uint8_t want[TS_AUTH_MAC_LEN];
  ts_auth_mac(token, nonce, len, want);
  return same_mac(want, mac, mac_len);
}

void ts_auth_task_key(const char *token, int task, char out[TS_AUTH_TASK_KEY_LEN + 1]) {
  char label[32];
  int n = snprintf(label, sizeof label, "worker/%d", task);
  uint8_t mac[TS_AUTH_MAC_LEN];
  ts_auth_mac(token, (const uint8_t *)label, (size_t)n, mac);
  sodium_bin2hex(out, TS_AUTH_TASK_KEY_LEN + 1, mac, sizeof mac);
  sodium_memzero(mac, sizeof mac);
}

int ts_auth_verify_task(const char *token, int task, const uint8_t *nonce, size_t len,
                        const uint8_t *mac, size_t mac_len) {
  char key[TS_AUTH_TASK_KEY_LEN + 1];
  ts_auth_task_key(token, task, key);
  int rc = ts_auth_verify(key, nonce, len, mac, mac_len);
  sodium_memzero(key, sizeof key);
  return rc;
}

static const char proof_label[] = "tessera shard proof";

void ts_auth_proof(const char *key, const uint8_t *server_nonce, const uint8_t *client_nonce,
                   uint8_t out[TS_AUTH_MAC_LEN]) {
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, (const unsigned char *)key, strlen(key));
  crypto_auth_hmacsha256_update(&st, (const unsigned char *)proof_label, sizeof proof_label - 1);
  crypto_auth_hmacsha256_update(&st, server_nonce, TS_AUTH_NONCE_LEN);
  crypto_auth_hmacsha256_update(&st, client_nonce, TS_AUTH_NONCE_LEN);
  crypto_auth_hmacsha256_final(&st, out);
}

int ts_auth_verify_proof(const char *key, const uint8_t *server_nonce, const uint8_t *client_nonce,
                         const uint8_t *proof, size_t proof_len) {
  uint8_t want[TS_AUTH_MAC_LEN];
  ts_auth_proof(key, server_nonce, client_nonce, want);
  return same_mac(want, proof, proof_len);
}
