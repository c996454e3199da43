#include "model.h"

#define GUARD 0xE7E7E7E7u
#define LR 0.05f

static float w[2] = {0.5f, -0.25f};   /* trained weights: SRAM (.data) */
static float b = 0.125f;
static int32_t step;
static uint32_t arena[2 + ET_ARENA_BYTES / 4]; /* guard, scratch, guard */
#ifdef ET_FIXTURE_SMASH_ARENA /* a kernel writing past its tensor */
static volatile int smash = 1;
#endif
#ifdef ET_FIXTURE_BSS_BYTES /* a program whose SRAM does not fit */
uint8_t et_fixture_big[ET_FIXTURE_BSS_BYTES];
#endif
#ifdef ET_FIXTURE_STACK_BYTES /* a kernel with a stack buffer of that many bytes */
__attribute__((noinline)) static float fixture_stack_kernel(float v)
{
    volatile uint8_t buf[ET_FIXTURE_STACK_BYTES];
    for (uint32_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)i;
    return v + buf[sizeof buf - 1] * 0.0f;
}
#endif

void et_init(void)
{
    arena[0] = GUARD;
    arena[1 + ET_ARENA_BYTES / 4] = GUARD;
}

float et_train_step(const void *input, const void *label)
{
    const float *x = input;
    float y = *(const float *)label;
    float *scratch = (float *)&arena[1];
    scratch[0] = w[0] * x[0] + w[1] * x[1] + b;
    scratch[1] = scratch[0] - y;
    float loss = scratch[1] * scratch[1];
#ifdef ET_FIXTURE_STACK_BYTES
    loss = fixture_stack_kernel(loss);
#endif
#ifdef ET_FIXTURE_VLA /* a stack buffer sized at run time: no static bound */
    volatile float vla[1 + (step & 7)];
    vla[0] = loss;
    loss = vla[0];
#endif
#ifdef ET_FIXTURE_BSS_BYTES
    et_fixture_big[(uint32_t)loss % ET_FIXTURE_BSS_BYTES] = 1;
#endif
    float g = 2.0f * scratch[1];
    w[0] -= LR * g * x[0];
    w[1] -= LR * g * x[1];
    b -= LR * g;
    ++step;
#ifdef ET_FIXTURE_SMASH_ARENA
    if (smash)
        arena[1 + ET_ARENA_BYTES / 4] = 0;
#endif
    return loss;
}

void et_predict(const void *input, float *out)
{
    const float *x = input;
    out[0] = w[0] * x[0] + w[1] * x[1] + b;
}

int32_t et_get_step(void)
{
    return step;
}

int et_check_guards(void)
{
    return !(arena[0] == GUARD && arena[1 + ET_ARENA_BYTES / 4] == GUARD);
}
