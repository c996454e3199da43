/* QEMU TCG plugin (built for the host by cortexm.py) counting guest instructions between
 * calls of the firmware's et_icount_mark(): every executed translation block adds its
 * instruction count to a counter (inline, cheap), and each entry to the marker function
 * appends the running count to a file, one number per line. Arguments:
 *   marker=<hex address of et_icount_mark, Thumb bit cleared>  out=<file>
 * Only the few plugin API functions it uses are declared here (QEMU's plugin API, version 1,
 * as in QEMU 4.2 to 8.x). */
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
typedef struct {
    const char *target_name;
    struct { int min; int cur; } version;
    bool system_emulation;
} qemu_info_t; /* leading fields only; QEMU passes a pointer */

enum qemu_plugin_cb_flags { QEMU_PLUGIN_CB_NO_REGS, QEMU_PLUGIN_CB_R_REGS, QEMU_PLUGIN_CB_RW_REGS };
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*qemu_plugin_vcpu_udata_cb_t)(unsigned int vcpu_index, void *userdata);

void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb *tb);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb, enum qemu_plugin_op op,
                                              void *ptr, uint64_t imm);
void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb *tb, qemu_plugin_vcpu_udata_cb_t cb,
                                          enum qemu_plugin_cb_flags flags, void *userdata);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

static uint64_t insn_count;
static uint64_t marker_addr;
static FILE *out;

static void on_marker(unsigned int vcpu_index, void *userdata)
{
    (void)vcpu_index;
    (void)userdata;
    fprintf(out, "%" PRIu64 "\n", insn_count);
    fflush(out);
}

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &insn_count,
                                             qemu_plugin_tb_n_insns(tb));
    if (qemu_plugin_tb_vaddr(tb) == marker_addr)
        qemu_plugin_register_vcpu_tb_exec_cb(tb, on_marker, QEMU_PLUGIN_CB_NO_REGS, NULL);
}

__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id,
                                                               const qemu_info_t *info,
                                                               int argc, char **argv)
{
    (void)info;
    const char *path = NULL;
    for (int i = 0; i < argc; ++i) {
        if (strncmp(argv[i], "marker=", 7) == 0)
            marker_addr = strtoull(argv[i] + 7, NULL, 0);
        else if (strncmp(argv[i], "out=", 4) == 0)
            path = argv[i] + 4;
    }
    if (path == NULL || marker_addr == 0)
        return -1;
    out = fopen(path, "w");
    if (out == NULL)
        return -1;
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    return 0;
}
