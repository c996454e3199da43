/* QEMU TCG plugin (built for the host by qemu_run.py, once per ISA) counting the guest's executed
 * instructions by class between calls of the firmware's et_icount_mark(), per function.
 *
 * At translation, each instruction of a translation block (TB) is classified from its encoding
 * by the ISA's decoder (et_decode of the icount_decode.h the build's -I finds: runtime/cortexm/'s
 * for Thumb-2, runtime/riscv/'s for RV32: loads, stores, multiplies, SIMD, divides, branches,
 * floating point, ...) into a per-TB table, and the TB is attributed to the function holding its
 * first instruction (the symbol file). At execution a callback adds the TB's table to its
 * function's counters. A conditional branch ends its TB (QEMU's ARM and RISC-V translators end a
 * TB at every branch):
 * it counts as taken or not when the next TB starts, taken when that TB is not the branch's
 * fall-through. Each entry to the marker function writes every function's running counters:
 *     mark <i> <total instructions>
 *     <function index> <count of class 0> ... <count of class N-1> <words>
 *     end
 * (function index = the line of the symbol file, or the number of lines for code outside every
 * symbol; `words`: the registers moved by LDM/STM/PUSH/POP/LDRD/STRD and the words moved by
 * VLDR/VSTR/VLDM/VSTM/VPUSH/VPOP).
 * The class order is cycles.py's CLASSES. Arguments:
 *   marker=<hex address of et_icount_mark, Thumb bit cleared>  out=<file>
 *   symbols=<file of lines "<hex start> <hex size> <name>", sorted by start> (optional)
 * Only the few plugin API functions it uses are declared here (QEMU's plugin API, version 1,
 * as in QEMU 4.2 to 8.x), weak so that the library also loads outside QEMU (tests call
 * et_decode through ctypes). */
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
struct qemu_plugin_insn;
typedef struct {
    const char *target_name;
    struct { int min; int cur; } version;
    bool system_emulation;
} qemu_info_t; /* leading fields only; QEMU passes a pointer */

enum qemu_plugin_cb_flags { QEMU_PLUGIN_CB_NO_REGS, QEMU_PLUGIN_CB_R_REGS, QEMU_PLUGIN_CB_RW_REGS };
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*qemu_plugin_vcpu_udata_cb_t)(unsigned int vcpu_index, void *userdata);

#define QEMU_API __attribute__((weak))
QEMU_API void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
QEMU_API size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
QEMU_API uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb *tb);
QEMU_API struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *tb, size_t idx);
QEMU_API const void *qemu_plugin_insn_data(const struct qemu_plugin_insn *insn);
QEMU_API size_t qemu_plugin_insn_size(const struct qemu_plugin_insn *insn);
QEMU_API void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb *tb, qemu_plugin_vcpu_udata_cb_t cb,
                                                   enum qemu_plugin_cb_flags flags, void *userdata);

#define EXPORT __attribute__((visibility("default")))
EXPORT int qemu_plugin_version = 1;

/* ---- instruction classes (cycles.py CLASSES, same order) ------------------------------------ */
enum et_class {
    ET_OTHER,            /* data processing, moves, compares, shifts, extends, IT, hints, system */
    ET_LOAD,             /* LDR, LDRB/H, LDRSB/H (any addressing, literal), LDREX* */
    ET_LOAD_MULTIPLE,    /* LDM, POP without PC, LDRD (its registers in `words`) */
    ET_STORE,            /* STR, STRB/H, STREX* */
    ET_STORE_MULTIPLE,   /* STM, PUSH, STRD */
    ET_MUL,              /* MUL (32 x 32 -> 32) */
    ET_MAC,              /* MLA, MLS, SMULL, UMULL, SMLAL, UMLAL, UMAAL, SMULxy, SMLAxy, SMULWy, SMLAWy, SMMUL, SMMLA, SMMLS */
    ET_SIMD,             /* DSP: SMLAD, SMLSD, SMUAD, SMUSD, SMLALD, SMLSLD, SXTB16, UXTB16, SXTAB16, UXTAB16,
                            SSAT, USAT, SSAT16, USAT16, QADD, QSUB, QDADD, QDSUB, parallel add/sub (SADD16,
                            QADD8, UHSUB8, ...), SEL, PKHBT/PKHTB, USAD8, USADA8 */
    ET_DIV,              /* SDIV, UDIV */
    ET_BRANCH_TAKEN,     /* B, BL, BX, BLX, Bcc/CBZ/CBNZ taken, POP/LDM/LDR with PC, MOV/ADD to PC, TBB, TBH */
    ET_BRANCH_NOT_TAKEN, /* Bcc, CBZ, CBNZ (or a branch in an IT block) not taken */
    ET_FP,               /* VADD, VSUB, VMUL, VNMUL, VABS, VNEG, VCMP, VCVT, VMOV, VMRS, VMSR */
    ET_FP_MAC,           /* VMLA, VMLS, VNMLA, VNMLS, VFMA, VFMS, VFNMA, VFNMS */
    ET_FP_DIV,           /* VDIV, VSQRT */
    ET_FP_LOAD,          /* VLDR, VLDM, VPOP (the words they move in `words`) */
    ET_FP_STORE,         /* VSTR, VSTM, VPUSH */
    ET_NCLASS
};

/* the ISA's decoder: et_insn_size, et_decode, et_it_block_length (the build's -I names the
 * target's runtime folder: runtime/cortexm/ for Thumb-2, runtime/riscv/ for RV32) */
#include <icount_decode.h>

/* ---- counting ---------------------------------------------------------------------------- */
typedef struct {
    uint64_t counts[ET_NCLASS];
    uint64_t words;
} counters_t;

typedef struct {
    counters_t static_counts; /* every instruction but a final conditional branch */
    uint64_t n_insns;
    uint64_t vaddr;
    uint64_t fallthrough;     /* the address after the last instruction */
    int conditional_last;     /* the TB ends with a conditional branch */
    int func;                 /* index into funcs (nfuncs: outside every symbol) */
} tb_info_t;

static uint64_t marker_addr;
static FILE *out;
static uint64_t *sym_start, *sym_end;
static int nfuncs;
static counters_t *funcs; /* nfuncs + 1 */
static uint64_t total_insns;
static uint64_t mark_index;
static const tb_info_t *pending; /* the last TB executed, when it ended with a conditional branch */

static int func_of(uint64_t addr)
{
    int lo = 0, hi = nfuncs - 1, found = nfuncs;
    while (lo <= hi) { /* the last symbol starting at or before addr */
        int mid = (lo + hi) / 2;
        if (sym_start[mid] <= addr) {
            found = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    if (found < nfuncs && addr < sym_end[found])
        return found;
    return nfuncs;
}

static void write_mark(void)
{
    fprintf(out, "mark %" PRIu64 " %" PRIu64 "\n", mark_index++, total_insns);
    for (int f = 0; f <= nfuncs; ++f) {
        const counters_t *c = &funcs[f];
        uint64_t any = c->words;
        for (int k = 0; k < ET_NCLASS; ++k)
            any |= c->counts[k];
        if (!any)
            continue;
        fprintf(out, "%d", f);
        for (int k = 0; k < ET_NCLASS; ++k)
            fprintf(out, " %" PRIu64, c->counts[k]);
        fprintf(out, " %" PRIu64 "\n", c->words);
    }
    fputs("end\n", out);
    fflush(out);
}

static void on_exec(unsigned int vcpu_index, void *userdata)
{
    (void)vcpu_index;
    const tb_info_t *tb = userdata;
    if (pending != NULL) {
        int taken = tb->vaddr != pending->fallthrough;
        funcs[pending->func].counts[taken ? ET_BRANCH_TAKEN : ET_BRANCH_NOT_TAKEN]++;
        pending = NULL;
    }
    if (tb->vaddr == marker_addr)
        write_mark(); /* before this TB: a step's counts end with its last `bl et_icount_mark` */
    counters_t *c = &funcs[tb->func];
    for (int k = 0; k < ET_NCLASS; ++k)
        c->counts[k] += tb->static_counts.counts[k];
    c->words += tb->static_counts.words;
    total_insns += tb->n_insns;
    if (tb->conditional_last)
        pending = tb;
}

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    tb_info_t *info = calloc(1, sizeof *info);
    if (info == NULL)
        abort();
    size_t n = qemu_plugin_tb_n_insns(tb);
    uint64_t pc = qemu_plugin_tb_vaddr(tb);
    info->vaddr = pc;
    info->n_insns = n;
    info->func = func_of(pc);
    int it_left = 0;
    for (size_t i = 0; i < n; ++i) {
        const struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        const uint8_t *bytes = qemu_plugin_insn_data(insn);
        int size = et_insn_size(bytes, (int)qemu_plugin_insn_size(insn));
        int words, conditional;
        int cls = et_decode(bytes, size, it_left > 0, &words, &conditional);
        int block = et_it_block_length(bytes, size);
        if (it_left > 0)
            --it_left;
        if (block)
            it_left = block;
        pc += (uint64_t)size;
        info->static_counts.words += (uint64_t)words;
        if (conditional && i + 1 == n)
            info->conditional_last = 1;
        else
            info->static_counts.counts[conditional ? ET_BRANCH_NOT_TAKEN : cls]++;
        /* a conditional branch inside a TB (not its last instruction) was not taken */
    }
    info->fallthrough = pc;
    qemu_plugin_register_vcpu_tb_exec_cb(tb, on_exec, QEMU_PLUGIN_CB_NO_REGS, info);
}

static int read_symbols(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t cap = 256;
    sym_start = malloc(cap * sizeof *sym_start);
    sym_end = malloc(cap * sizeof *sym_end);
    unsigned long long start, size;
    char name[512];
    while (sym_start && sym_end && fscanf(f, "%llx %llx %511s", &start, &size, name) == 3) {
        if ((size_t)nfuncs == cap) {
            cap *= 2;
            sym_start = realloc(sym_start, cap * sizeof *sym_start);
            sym_end = realloc(sym_end, cap * sizeof *sym_end);
            if (!sym_start || !sym_end)
                break;
        }
        sym_start[nfuncs] = start;
        sym_end[nfuncs] = start + size;
        ++nfuncs;
    }
    fclose(f);
    return (sym_start && sym_end) ? 0 : -1;
}

EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv)
{
    (void)info;
    const char *path = NULL, *symbols = NULL;
    for (int i = 0; i < argc; ++i) {
        if (strncmp(argv[i], "marker=", 7) == 0)
            marker_addr = strtoull(argv[i] + 7, NULL, 0);
        else if (strncmp(argv[i], "out=", 4) == 0)
            path = argv[i] + 4;
        else if (strncmp(argv[i], "symbols=", 8) == 0)
            symbols = argv[i] + 8;
    }
    if (path == NULL || marker_addr == 0)
        return -1;
    if (symbols != NULL && read_symbols(symbols) != 0)
        return -1;
    funcs = calloc((size_t)nfuncs + 1, sizeof *funcs);
    out = fopen(path, "w");
    if (out == NULL || funcs == NULL)
        return -1;
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    return 0;
}
