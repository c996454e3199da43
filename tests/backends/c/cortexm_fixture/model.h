/* A hand-written program implementing the model.h API of the C backend (tests only): a
 * linear model y = w . x + b with 2 inputs, squared-error loss, SGD. */
#ifndef ET_MODEL_H
#define ET_MODEL_H
#include <stdint.h>
#define ET_INPUT_BYTES 8
#define ET_LABEL_BYTES 4
#define ET_NUM_CLASSES 1
#define ET_ARENA_BYTES 16
void et_init(void);
float et_train_step(const void *input, const void *label);
void et_predict(const void *input, float *out);
int et_check_guards(void);
int32_t et_get_step(void);
#endif
