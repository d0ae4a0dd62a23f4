#include "ts_fpenv.h"

#if defined(__x86_64__) || defined(__i386__)
#include <pmmintrin.h>
#include <xmmintrin.h>

bool ts_fpenv_flush_denormals(void) {
  _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
  _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
  return true;
}

bool ts_fpenv_flushing_denormals(void) {
  return _MM_GET_FLUSH_ZERO_MODE() == _MM_FLUSH_ZERO_ON;
}

#elif defined(__aarch64__)
#include <stdint.h>

#define FPCR_FZ (UINT64_C(1) << 24)

static uint64_t get_fpcr(void) {
  uint64_t v;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(v));
  return v;
}

bool ts_fpenv_flush_denormals(void) {
  uint64_t v = get_fpcr() | FPCR_FZ;
  __asm__ __volatile__("msr fpcr, %0" : : "r"(v));
  return true;
}

bool ts_fpenv_flushing_denormals(void) {
  return (get_fpcr() & FPCR_FZ) != 0;
}

#else
bool ts_fpenv_flush_denormals(void) {
  return false;
}

bool ts_fpenv_flushing_denormals(void) {
  return false;
}
#endif
