/*
 * The libFuzzer entry point, shared by each target (fuzz_*.c) and the corpus replay driver
 * (replay_main.c), which links a target without libFuzzer so its corpus runs as a test.
 */
#ifndef TS_FUZZ_TARGET_H
#define TS_FUZZ_TARGET_H

#include <stddef.h>
#include <stdint.h>

/* Runs one input. Returns 0; a violated invariant aborts. data[0..size) is only read. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Aborts, naming the target and the invariant, unless ok. */
void fuzz_check(int ok, const char *target, const char *what);

#endif
