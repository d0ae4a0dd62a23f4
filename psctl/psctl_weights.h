/*
 * A model's parameters as a file other frameworks read (psctl export): safetensors
 * (huggingface.co/docs/safetensors: an 8-byte little-endian header length, a JSON header
 * naming each tensor's dtype, shape and byte range, the raw little-endian bytes) or numpy's
 * .npz (a zip of one .npy file per tensor, stored uncompressed). No Debian package writes
 * either from C, and both layouts are a page long, so they are written here.
 *
 * The file is written beside its final name and renamed into place after an fsync: a
 * failed export leaves no partial file under the name asked for.
 */
#ifndef PSCTL_WEIGHTS_H
#define PSCTL_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

typedef enum { PSCTL_WEIGHTS_SAFETENSORS, PSCTL_WEIGHTS_NPZ } psctl_weights_format_t;

typedef enum { PSCTL_DT_F32, PSCTL_DT_I64, PSCTL_DT_U64, PSCTL_DT_U8 } psctl_dtype_t;

/* At most this many dimensions per entry. */
#define PSCTL_WEIGHTS_MAX_RANK 8

/* One array: name (UTF-8, no NUL; "conv1/kernel"), element type, shape[rank] and the data
 * (product of shape elements, little-endian, C order). Borrowed: nothing is copied. */
typedef struct {
  const char *name;
  psctl_dtype_t dtype;
  uint64_t shape[PSCTL_WEIGHTS_MAX_RANK];
  size_t rank;
  const void *data;
} psctl_weights_entry_t;

/* "safetensors" or "npz" into *out: 0, or TS_EINVAL for anything else. */
int psctl_weights_parse_format(const char *name, psctl_weights_format_t *out);

/* Bytes per element of dtype. */
size_t psctl_dtype_size(psctl_dtype_t dtype);

/* Write entries[0..n) to path in format fmt, with metadata: a JSON object whose members
 * are strings (safetensors' __metadata__; in an .npz, the entry __metadata__.npy, a uint8
 * array of the object's UTF-8 JSON text). Names must be distinct and not "__metadata__".
 * Returns 0, TS_EINVAL (a bad entry or metadata, errmsg names it), TS_ETOOBIG (an .npz over
 * 4 GiB: zip64 is not written) or a negative errno (the file could not be written: errmsg
 * names path). */
int psctl_weights_write(const char *path, psctl_weights_format_t fmt,
                        const psctl_weights_entry_t *entries, size_t n, const char *metadata,
                        char *errmsg, size_t errlen);

#endif
