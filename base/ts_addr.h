/*
 * Addresses: the "host:port" strings of the job file (cluster.ps, cluster.ps_http, ...),
 * parsed and resolved in one place for the shard's listener, the admin endpoint and the
 * client.
 *
 * Accepted forms: "name:port", "1.2.3.4:port", "[v6]:port" (a bare IPv6 address is
 * ambiguous and refused); the port is 1..65535. Parsing is a pure function; resolving uses
 * getaddrinfo and so may block on DNS: call it at start-up, never on an event loop.
 */
#ifndef TS_ADDR_H
#define TS_ADDR_H

#include <netdb.h>
#include <stdbool.h>
#include <stddef.h>

/* Split addr into host (NUL-terminated, brackets removed, at most hostlen - 1 bytes) and
 * port. host and port may be NULL to validate only. Returns 0, or TS_EINVAL for a string
 * that is not host:port or whose host does not fit. */
int ts_addr_split(const char *addr, char *host, size_t hostlen, int *port);

/* Resolve addr for a TCP socket: passive for a listener (AI_PASSIVE), else for connect.
 * On success *out owns the list (freeaddrinfo). On failure returns TS_EINVAL with the reason
 * in errmsg ("'x' is not host:port", "cannot resolve 'h': Name or service not known"),
 * for the caller to wrap with what the address is for. */
int ts_addr_resolve(const char *addr, bool passive, struct addrinfo **out, char *errmsg,
                    size_t errlen);

#endif
