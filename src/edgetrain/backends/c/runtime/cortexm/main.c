/* edgetrain training firmware: et_init, then one et_train_step per embedded sample (from the
 * first one a reset left undone, with two weight banks), printing
 * `step <n> loss <value>` (n = et_get_step(), the steps done; the value as "%.9g": the host
 * driver prints the same text for the same float), then the stack high-water mark. Exit
 * status: 0, or ET_EXIT_* on a guard-word failure, printed as the last line (board.c).
 * Numbers are formatted by et_format.h, not newlib's printf (20 KB of flash). */
#include "cortexm.h"
#include "et_format.h"
#include "model.h"
#include "samples.h"
#include "board.h"

/* Longest line printed: "step <int> loss <%.9g>" or the stack line. */
#define LINE_CHARS 96

/* appends text to the line at *end, a byte at a time (with strlen and memcpy it linked newlib's
 * strlen, 220 bytes of flash, for this function alone) */
static void put_text(char **end, const char *text)
{
    while ((**end = *text++) != '\0')
        ++*end;
}

static void put_int(char **end, long v)
{
    if (v < 0) {
        *(*end)++ = '-';
        *end += et_format_u(*end, (unsigned long)-v);
    } else {
        *end += et_format_u(*end, (unsigned long)v);
    }
}

/* Called right before (2 i) and right after (2 i + 1) training step i: the QEMU
 * instruction-count plugin records the running count at each call (cortexm.py reads this
 * function's address from the ELF); it must stay a real, separate function. */
__attribute__((noinline, used)) void et_icount_mark(int i)
{
    __asm__ volatile("" : : "r"(i) : "memory");
}

int main(void)
{
    char line[LINE_CHARS];
    int status = ET_EXIT_OK;
    et_init();
    const int first = (int)et_get_step(); /* two weight banks: the steps a reset left committed */
    if (first > 0) {
        char *end = line;
        put_text(&end, "resumed at step ");
        put_int(&end, first);
        put_text(&end, "\n");
        et_console_puts(line);
    }
    for (int i = first; i < ET_NUM_SAMPLES; ++i) {
        et_icount_mark(2 * i);
        float loss = et_train_step(et_sample_input[i], et_sample_label[i]);
        et_icount_mark(2 * i + 1);
        char *end = line;
        put_text(&end, "step ");
        put_int(&end, (long)et_get_step());
        put_text(&end, " loss ");
        end += et_format_g9(end, loss);
        put_text(&end, "\n");
        et_console_puts(line);
        if (et_check_guards() != 0) {
            et_console_puts("edgetrain: arena guard word overwritten\n");
            status = ET_EXIT_ARENA_GUARD;
            break;
        }
    }
    if (!et_stack_guard_ok()) {
        et_console_puts("edgetrain: stack overflow (guard word overwritten)\n");
        status = ET_EXIT_STACK_GUARD;
    }
    char *end = line;
    put_text(&end, "stack high water ");
    end += et_format_u(end, (unsigned long)et_stack_high_water());
    put_text(&end, " of ");
    end += et_format_u(end, (unsigned long)et_stack_reserve());
    put_text(&end, " bytes\n");
    et_console_puts(line);
    return status;
}
