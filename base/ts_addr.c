#include "ts_addr.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "ts_err.h"

int ts_addr_split(const char *addr, char *host, size_t hostlen, int *port) {
  if (!addr || !*addr) return TS_EINVAL;
  const char *h, *colon;
  size_t hlen;
  if (addr[0] == '[') {
    const char *close = strchr(addr, ']');
    if (!close || close[1] != ':') return TS_EINVAL;
    h = addr + 1;
    hlen = (size_t)(close - h);
    colon = close + 1;
    if (hlen == 0 || memchr(h, ':', hlen) == NULL) return TS_EINVAL; /* [v4]:port is odd */
    for (size_t i = 0; i < hlen; i++)
      if (!isxdigit((unsigned char)h[i]) && h[i] != ':' && h[i] != '.' && h[i] != '%' &&
          !isalnum((unsigned char)h[i]))
        return TS_EINVAL;
  } else {
    colon = strrchr(addr, ':');
    if (!colon) return TS_EINVAL;
    h = addr;
    hlen = (size_t)(colon - h);
    if (hlen == 0) return TS_EINVAL;
    /* A bare IPv6 address ("::1:7100") is ambiguous: it must be bracketed. */
    for (size_t i = 0; i < hlen; i++)
      if (!isalnum((unsigned char)h[i]) && h[i] != '-' && h[i] != '.' && h[i] != '_')
        return TS_EINVAL;
  }
  const char *p = colon + 1;
  size_t plen = strlen(p);
  if (plen == 0 || plen > 5) return TS_EINVAL;
  int v = 0;
  for (size_t i = 0; i < plen; i++) {
    if (!isdigit((unsigned char)p[i])) return TS_EINVAL;
    v = v * 10 + (p[i] - '0');
  }
  if (v < 1 || v > 65535) return TS_EINVAL;
  if (host) {
    if (hlen + 1 > hostlen) return TS_EINVAL;
    memcpy(host, h, hlen);
    host[hlen] = '\0';
  }
  if (port) *port = v;
  return 0;
}

int ts_addr_resolve(const char *addr, bool passive, struct addrinfo **out, char *errmsg,
                    size_t errlen) {
  *out = NULL;
  char host[256];
  int port;
  if (ts_addr_split(addr, host, sizeof host, &port) < 0) {
    snprintf(errmsg, errlen, "'%s' is not host:port", addr ? addr : "");
    return TS_EINVAL;
  }
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  int gai = getaddrinfo(host, portstr, &hints, out);
  if (gai != 0) {
    snprintf(errmsg, errlen, "cannot resolve '%s': %s", host, gai_strerror(gai));
    *out = NULL;
    return TS_EINVAL;
  }
  return 0;
}
