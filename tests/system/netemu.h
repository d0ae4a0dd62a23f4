/*
 * A small network for system tests: n nodes, each a network namespace of its own with a
 * TUN device at 10.77.0.(i+1)/24, joined by a switch in this process that can delay
 * packets (with jitter), lose a share of them, and cut a node off entirely (a partition:
 * its packets vanish both ways, no reset, no error, as on a dead link).
 *
 * Why a switch of our own and not veth pairs with `tc qdisc ... netem`: the kernels that
 * run our tests do not all have sch_netem (nor act_gact or nft), and a TUN device is
 * everywhere. The switch does what netem would on every packet, and what it did is
 * counted (ts_netemu_stats).
 *
 * Namespaces are named "tsnf<pid>-<i>"; ts_netemu_start registers their removal at exit
 * and on SIGTERM/SIGINT/SIGALRM/SIGABRT (meson's timeout, a failed assertion), and removes
 * namespaces left over by test processes that no longer run. Root and iproute2 are
 * needed: without them ts_netemu_start returns 77 with the reason in why.
 */
#ifndef TS_NETEMU_H
#define TS_NETEMU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define TS_NETEMU_MAX 8

typedef struct ts_netemu ts_netemu_t;

typedef struct {
  uint64_t forwarded, lost, cut; /* packets delivered, dropped at random, dropped by a cut */
  uint64_t max_stall_ns;         /* the longest a thread of the switch ran late (machine stalls) */
} ts_netemu_stats_t;

/* Make n nodes (at most TS_NETEMU_MAX) and start the switch with no faults. Returns 0, 77
 * when this machine cannot (not root, no `ip netns`, no /dev/net/tun; why says which), or
 * -1 on an error (why says it). *out is freed by ts_netemu_stop. */
int ts_netemu_start(ts_netemu_t **out, int n, char *why, size_t whylen);

/* Every packet from now on is delayed by delay_ms ± jitter_ms (uniform; so packets get
 * reordered, as netem's jitter does) and lost with probability loss (0..1). */
void ts_netemu_set(ts_netemu_t *e, double delay_ms, double jitter_ms, double loss);

/* Cut node i off (or join it again): every packet to or from it is dropped. */
void ts_netemu_cut(ts_netemu_t *e, int node, bool cut);

/* Node i's address, "10.77.0.(i+1)". */
const char *ts_netemu_addr(const ts_netemu_t *e, int node);

/* Start argv (argv[0] a path) in node i's namespace with stdout and stderr appended to the
 * files out and err (NULL: inherited). The child dies with this process. Returns its pid
 * or -1. */
pid_t ts_netemu_spawn(ts_netemu_t *e, int node, const char *const *argv, const char *out,
                      const char *err);

/* Move the calling thread into node i's namespace (to talk to the nodes from the test
 * itself); -1 on failure. */
int ts_netemu_enter(ts_netemu_t *e, int node);

ts_netemu_stats_t ts_netemu_stats(ts_netemu_t *e);

/* Stop the switch, return the calling thread to the namespace it started in, and remove
 * the namespaces. NULL is a no-op. */
void ts_netemu_stop(ts_netemu_t *e);

#endif
