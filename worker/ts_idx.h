/*
 * IDX data files (the MNIST / Fashion-MNIST format), plain or gzip-compressed.
 *
 * An IDX file is a big-endian header, magic 0x000008TD (T = 0x08: unsigned bytes, D = the
 * number of dimensions), then D u32 sizes, then the data. Tessera reads two kinds:
 *   images  0x00000803: [n, rows, cols] u8 pixels, scaled to [0, 1] floats (p / 255)
 *   labels  0x00000801: [n] u8 class indices
 * Every file is validated in full: magic, dimensions (all > 0, the total within
 * TS_IDX_MAX_BYTES), and the exact data size: a truncated file or trailing bytes are
 * errors, not a crash or a silent partial read. Labels are not assumed to be below 10: the
 * largest one is reported so the caller can check it against the model's classes.
 *
 * Errors are TS_EDATA (the file is not what it should be), TS_ENOMEM, or a negative errno
 * when the file cannot be opened or read; errmsg (errlen bytes) then holds one line that
 * starts with the file's path, such as "data/train-images-idx3-ubyte.gz: truncated: expected
 * 47040000 bytes of pixel data after the 16-byte header, found 1000 (zlib: unexpected end of
 * file)". errmsg may be NULL.
 */
#ifndef TS_IDX_H
#define TS_IDX_H

#include <stddef.h>
#include <stdint.h>

#define TS_IDX_MAGIC_IMAGES 0x00000803u
#define TS_IDX_MAGIC_LABELS 0x00000801u
/* Largest data section accepted: 4 GiB of pixels (16 GiB as floats). Bounds the allocation
 * a corrupt header can ask for. */
#define TS_IDX_MAX_BYTES (UINT64_C(4) << 30)

typedef struct {
  size_t n;          /* examples */
  size_t rows, cols; /* image size: each example is rows * cols floats */
  float *x;          /* n * rows * cols pixels in [0, 1], row-major, example after example */
  int32_t *labels;   /* n labels (int32 so a slice can go to ts_model_* directly) */
  int32_t max_label; /* the largest label in the file */
} ts_dataset_t;

/* Read an images file. On success *x (n * rows * cols floats) is the caller's, freed with
 * ts_free. On error nothing is allocated and the outputs are untouched. */
int ts_idx_read_images(const char *path, size_t *n, size_t *rows, size_t *cols, float **x,
                       char *errmsg, size_t errlen);

/* Read a labels file. On success *labels (n int32) is the caller's, freed with ts_free, and
 * *max_label (may be NULL) is the largest label. */
int ts_idx_read_labels(const char *path, size_t *n, int32_t **labels, int32_t *max_label,
                       char *errmsg, size_t errlen);

/* Read an images file and its labels file into *ds, and check that they hold the same
 * number of examples (else TS_EDATA naming both files and both counts). On error *ds is
 * zeroed and nothing is allocated. Free with ts_dataset_free. */
int ts_idx_load_pair(const char *images_path, const char *labels_path, ts_dataset_t *ds,
                     char *errmsg, size_t errlen);

/* Free a dataset's buffers and zero it. Safe on a zeroed struct and on NULL. */
void ts_dataset_free(ts_dataset_t *ds);

#endif
