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

int ts_auth_verify(const char *token, const uint8_t *nonce, size_t len, const uint8_t *mac,
                   size_t mac_len) {
  if (mac_len != TS_AUTH_MAC_LEN) return TS_EAUTH;
  uint8_t want[TS_AUTH_MAC_LEN];
  ts_auth_mac(token, nonce, len, want);
  int ok = sodium_memcmp(want, mac, TS_AUTH_MAC_LEN) == 0;
  sodium_memzero(want, sizeof want);
  return ok ? 0 : TS_EAUTH;
}
