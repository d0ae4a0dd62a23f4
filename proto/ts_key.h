/*
 * Keys of embedding tables (docs/architecture.md, "Tables"): which shard holds a key's row,
 * and the value a row is made with on first touch. Pure functions every process computes
 * alike: a worker sends each key to the shard this names, and a row's first value depends
 * only on (seed, table, key), so any shard count (and a re-sharded restore) gives the same
 * rows.
 *
 * Glossary:
 *   key        a row's id: an int64 id as the model has it, taken as its 64 bits (uint64_t)
 *   table key  ts_init_key(seed, table name): the table's stream of the initialiser
 */
#ifndef TS_KEY_H
#define TS_KEY_H

#include <stddef.h>
#include <stdint.h>

/* The initialiser of a table's rows: every element of a new row is */
typedef enum {
  TS_KEY_INIT_ZEROS = 0,            /* 0 */
  TS_KEY_INIT_UNIFORM = 1,          /* uniform in [-param, param) */
  TS_KEY_INIT_NORMAL = 2,           /* normal, standard deviation param */
  TS_KEY_INIT_TRUNCATED_NORMAL = 3, /* normal, sd param, redrawn beyond 2 sd (as Keras) */
} ts_key_init_t;

/* The key's bits well mixed (the MurmurHash3 finaliser): consecutive ids spread evenly. */
uint64_t ts_key_hash(uint64_t key);

/* The shard of num_shards (> 0) that holds key's row: the high word of ts_key_hash(key) *
 * num_shards, uniform over the shards without a division. */
uint32_t ts_key_shard(uint64_t key, uint32_t num_shards);

/* Fill row[0..dim) with the first value of key's row in the table whose table key is
 * table_key (ts_init_key(seed, name)): element j is drawn from the counter-based generator
 * of ts_init_uniform with the stream (table_key, key) and counter j (normal values from two
 * counters per draw, Box-Muller), so it depends on nothing else. */
void ts_key_row_init(float *row, size_t dim, ts_key_init_t init, double param, uint64_t table_key,
                     uint64_t key);

#endif
