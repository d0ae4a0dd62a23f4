/* The xorshift64* generator the numeric unit tests draw their data from. Each test program
 * keeps its own state (its seed fixes its data) and includes this once; it is static. */
#ifndef TS_TEST_RNG_FIXTURE_H
#define TS_TEST_RNG_FIXTURE_H

#include <stdint.h>

/* The next value of the generator whose state is *state, uniform in [0, 1). */
static inline double rng_uniform(uint64_t *state) {
  *state ^= *state >> 12;
  *state ^= *state << 25;
  *state ^= *state >> 27;
  return (double)((*state * 2685821657736338717ULL) >> 11) * (1.0 / 9007199254740992.0);
}

#endif
