/*
 * Click logs in the Criteo TSV format (the Kaggle Display Advertising Challenge), read as a
 * stream: one line at a time through zlib (plain or gzip files alike), never the whole file
 * in memory.
 *
 * A line is 40 tab-separated fields: the label (0 or 1), 13 integer features, 26
 * categorical features in hex (Criteo writes 8 digits; up to 16 are taken). Any feature may
 * be empty: missing. An integer becomes log(1 + x) (x < 0, which Criteo has in I2, counts
 * as 0), 0 when missing, as the usual Criteo pipelines (DLRM, TorchRec) transform them.
 * Anything else (a wrong field count, a label other than 0/1, a non-number, a bad hex
 * value, a line over TS_CRITEO_LINE_MAX bytes without its newline) is TS_EDATA with a
 * message naming the file and the line: "train.tsv:17: field 5 (I4): \"1x\" is not an
 * integer".
 */
#ifndef TS_CRITEO_H
#define TS_CRITEO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TS_CRITEO_INTS 13
#define TS_CRITEO_CATS 26
#define TS_CRITEO_LINE_MAX 4096

typedef struct {
  int32_t label;               /* 0 or 1 */
  float dense[TS_CRITEO_INTS]; /* log(1 + x), 0 when missing */
  bool int_missing[TS_CRITEO_INTS];
  uint64_t cat[TS_CRITEO_CATS]; /* the hex value; 0 when missing */
  bool cat_missing[TS_CRITEO_CATS];
} ts_criteo_row_t;

/* Parse one line (no newline; a trailing "\r" or "\n" is allowed) into *row. Pure: no I/O.
 * Returns 0 or TS_EDATA with why (whylen bytes, may be NULL) naming the field. */
int ts_criteo_parse(const char *line, ts_criteo_row_t *row, char *why, size_t whylen);

typedef struct ts_criteo_reader ts_criteo_reader_t;

/* Open path for reading. Returns 0, a negative errno (errmsg names the file) or TS_ENOMEM. */
int ts_criteo_open(ts_criteo_reader_t **out, const char *path, char *errmsg, size_t errlen);

/* The next row: returns 1 with *row filled, 0 at the end of the file, or TS_EDATA / a read
 * error with errmsg "PATH:LINE: why". */
int ts_criteo_next(ts_criteo_reader_t *r, ts_criteo_row_t *row, char *errmsg, size_t errlen);

/* Back to the first line (the next epoch). Returns 0 or a negative errno. */
int ts_criteo_rewind(ts_criteo_reader_t *r);

/* Count the rows of path in one streaming pass, checking every line (errors as next). */
int ts_criteo_count(const char *path, uint64_t *rows, char *errmsg, size_t errlen);

/* Close and free; NULL is fine. */
void ts_criteo_close(ts_criteo_reader_t *r);

#endif
