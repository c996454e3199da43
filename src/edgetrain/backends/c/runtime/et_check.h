/* Run-time checks (ops/check.py, kernels/check.py): a model's condition on its data, checked
 * where the reference runtime raises RunTimeCheckError. A failed check reports its message through
 * ET_ERROR_HOOK and keeps it (the first since the last et_check_error) for the caller: the host
 * library's runner raises the same error with it. Per program (its state is model.c's), so
 * included only by a program with a check and never compiled into the shared kernel object
 * (kernel_lib.PROGRAM_HEADERS). */
#ifndef ET_CHECK_H
#define ET_CHECK_H
#include "et_common.h" /* ET_ERROR_HOOK */

static const char *et_check_failed;

static void et_check_fail(const char *msg) {
    if (!et_check_failed) et_check_failed = msg;
    ET_ERROR_HOOK(msg);
}

/* the message of the first check that failed since the last call (0: none), then forgotten */
const char *et_check_error(void) {
    const char *msg = et_check_failed;
    et_check_failed = 0;
    return msg;
}

#endif /* ET_CHECK_H */
