/*
 * The floating-point environment of Tessera's compute threads.
 *
 * Subnormal ("denormal") floats are flushed to zero, as TensorFlow does in its compute
 * threads: results below FLT_MIN become 0 (flush-to-zero) and subnormal inputs are read as
 * 0 (denormals-are-zero). Without it x86 cores take a microcode assist of 100+ cycles on
 * every operation that produces or reads a subnormal, and training makes many: Adam's
 * second moments of parameters whose gradients die out decay towards 0 by beta2 each step,
 * and ReLU networks keep activations and gradients near 0. Measured on this project's
 * machines, the [784, 128, 10] MLP with Adam ran 3.4 times slower after 5,000 steps.
 *
 * ts_fpenv_flush_denormals sets it for the calling thread; threads created afterwards
 * inherit it (POSIX: a new thread starts with its creator's floating-point environment),
 * so the daemons call it first thing in main(). The client library never calls it: a
 * program that links the library keeps its own environment.
 */
#ifndef TS_FPENV_H
#define TS_FPENV_H

#include <stdbool.h>

/* Flush subnormal floats to zero in this thread (and the threads it creates from now on).
 * Returns true where the CPU has such a mode (x86-64 SSE: MXCSR FTZ and DAZ; AArch64: FPCR
 * FZ), false elsewhere (nothing changed). */
bool ts_fpenv_flush_denormals(void);

/* Whether this thread flushes subnormal results to zero. */
bool ts_fpenv_flushing_denormals(void);

#endif
