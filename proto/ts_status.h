/*
 * A shard's ShardStatus message as the client library's plain-C status
 * (ts_client_shard_status_t of include/tessera/client.h): the one conversion, used by the
 * client library (ts_client_status) and by a shard's own /status page (server/ts_shard_admin.c),
 * so both show the same fields.
 */
#ifndef TS_STATUS_H
#define TS_STATUS_H

#include "tessera.pb-c.h"
#include "tessera/client.h"

/* Convert pb into *out: one ts_malloc'd block holding the struct, its workers, its barrier
 * list and its strings, freed with ts_free (ts_client_status_free). Returns 0 or TS_ENOMEM
 * (*out NULL). Pure: any thread. */
int ts_status_from_pb(const Tessera__ShardStatus *pb, ts_client_shard_status_t **out);

/* "last checkpoint: failed 3× (No space left on device)": the line psctl status and
 * health and a shard's /readyz show while checkpoints fail. */
void ts_status_checkpoint_note(char *buf, size_t n, uint32_t failures, const char *error);

/* The public mode of a wire mode (unknown values map to UNSPECIFIED). */
ts_client_mode_t ts_status_mode(Tessera__Mode mode);

#endif
