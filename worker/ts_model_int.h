/*
 * What the model's files share (ts_model.c, the facade, and one file per engine:
 * ts_model_mlp.c, ts_model_seq.c); nothing else includes this.
 *
 * An engine is a function table and a state. Its init function (declared in ts_model.h)
 * checks its own arguments, allocates its state, fills the public fields of ts_model_t
 * (tensors, params, grads, ... all pointing into that state) and sets model->engine and
 * model->impl; on failure it leaves *model zeroed. The facade (ts_model.c) checks what is
 * common to every engine before it calls one: a built model, offsets and counts within the
 * flat layout, batches within 1..batch_capacity, non-NULL data. So an engine's functions
 * receive only calls that pass those checks; labels are the engine's to check (it knows its
 * classes). The facade never looks inside impl, and no engine looks inside another's.
 *
 * Adding an engine: a file with its state, these functions and an init that fills the
 * model; the init's declaration in ts_model.h; the file in worker/meson.build. Nothing in
 * ts_model.c or the other engines changes.
 */
#ifndef TS_MODEL_INT_H
#define TS_MODEL_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ts_model.h"

struct ts_model_engine {
  const char *name; /* what the worker's log calls it: "mlp", "layers" */

  /* Copies of [offset, offset + count) of the flat layout (count >= 1, in range). */
  int (*set_params)(void *impl, size_t offset, const float *src, size_t count);
  int (*get_params)(const void *impl, size_t offset, float *dst, size_t count);
  int (*get_grads)(const void *impl, size_t offset, float *dst, size_t count);

  /* ts_model_load_batch, ts_model_compute, ts_model_evaluate with their arguments checked
   * (but the labels). */
  int (*load_batch)(void *impl, const float *x, const int32_t *labels, size_t batch);
  int (*compute)(void *impl, size_t batch, float *loss);
  int (*evaluate)(void *impl, const float *x, const int32_t *labels, size_t n, float *accuracy,
                  float *loss);

  /* The examples of the last compute's batch whose logits' argmax was their label. */
  int (*last_correct)(const void *impl, size_t *correct);

  /* Wait for every table the engine runs on. */
  int (*synchronize)(const void *impl);

  /* Optional (NULL: the engine has no such thing). Dropout on or off for the next steps,
   * with the masks' seed and stream; whether it runs on more than one table. */
  void (*set_training)(void *impl, bool on, uint64_t seed, uint64_t stream);
  bool (*is_split)(const void *impl);

  /* Free the state and everything it owns (impl itself included). */
  void (*destroy)(void *impl);
};

/* An engine's init, once its state is built: *model (zeroed) runs on engine, with the table
 * the model reports as its own and its batch capacity. Ownership of impl passes to the
 * model: ts_model_destroy frees it with engine->destroy. The engine then points the layout
 * fields (tensors, num_tensors, param_count, params, grads; ops for an op list) into impl. */
void ts_model_adopt(ts_model_t *model, const ts_model_engine_t *engine, void *impl,
                    const ts_kernels_t *kernels, size_t batch_capacity);

#endif
