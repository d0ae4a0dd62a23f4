/*
 * What psctl export's two sources share (psctl_export.c: the live shards;
 * psctl_export_ckpt.c: a checkpoint directory): the list of arrays to write, and writing it
 * with the job's description.
 */
#ifndef PSCTL_EXPORT_INT_H
#define PSCTL_EXPORT_INT_H

#include <stddef.h>
#include <stdint.h>

#include "psctl_export.h"
#include "psctl_weights.h"

typedef struct {
  psctl_weights_entry_t *e;
  void **owned; /* per entry, its buffer (freed with the list) */
  size_t n, cap;
} psctl_entries_t;

/* A zeroed entry at the end of es (its owned buffer NULL), or NULL when out of memory. The
 * list may move: pointers to earlier entries do not survive the call. */
psctl_weights_entry_t *psctl_entries_add(psctl_entries_t *es);
void psctl_entries_free(psctl_entries_t *es);

/* Write es to o->path in o->format with the job's description as metadata (cfg's
 * settings, the step, the names of the state tensors) and print what was written.
 * Returns a TS_EXIT_* code after printing why on stderr. */
int psctl_export_write(const ts_config_t *cfg, const psctl_export_opts_t *o, psctl_entries_t *es,
                       const char *const *state, size_t nstate, size_t ntensors, size_t ntables,
                       uint64_t step);

#endif
