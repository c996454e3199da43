/* QEMU TCG plugin (built for the host by cortexm.py) counting the guest's executed instructions
 * by class between calls of the firmware's et_icount_mark(), per function.
 *
 * At translation, each instruction of a translation block (TB) is classified from its Thumb-2
 * encoding (et_decode below: loads, stores, multiplies, DSP SIMD, divides, branches, floating
 * point, ...) into a per-TB table, and the TB is attributed to the function holding its first
 * instruction (the symbol file). At execution a callback adds the TB's table to its function's
 * counters. A conditional branch ends its TB (QEMU's ARM translator ends a TB at every branch):
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

static int popcount16(unsigned v) { return __builtin_popcount(v & 0xFFFFu); }

/* Coprocessor space (hw1 = 111x 11xx xxxx xxxx): the FPU's instructions are cp10 / cp11. */
static int decode_coproc(unsigned hw1, unsigned hw2, int *words)
{
    unsigned cp = (hw2 >> 8) & 0xF;
    if (cp != 10 && cp != 11)
        return ET_OTHER;
    if (((hw1 >> 9) & 1) == 0) { /* extension register load/store, 64-bit transfers */
        unsigned op = (hw1 >> 4) & 0x1F;
        if ((op & 0x1E) == 0x04 || (op & 0x1A) == 0) /* VMOV two core registers <-> D / two S */
            return ET_FP;
        int load = op & 1;
        if ((op & 0x12) == 0x10) { /* P=1, W=0: VLDR / VSTR, one word (S) or two (D: cp11) */
            *words = cp == 11 ? 2 : 1;
            return load ? ET_FP_LOAD : ET_FP_STORE;
        }
        *words = (int)(hw2 & 0xFF); /* imm8: words moved, single or double registers alike */
        return load ? ET_FP_LOAD : ET_FP_STORE;
    }
    if (((hw1 >> 8) & 3) != 2)
        return ET_OTHER;
    if (hw2 & 0x10) /* VMOV core <-> S, VMRS, VMSR */
        return ET_FP;
    unsigned opc1 = (hw1 >> 4) & 0xB; /* D bit (hw1[6]) masked */
    switch (opc1) {
    case 0x0: case 0x1: case 0x9: case 0xA: /* VMLA/VMLS, VNMLA/VNMLS, VFNMA/VFNMS, VFMA/VFMS */
        return ET_FP_MAC;
    case 0x8: /* VDIV */
        return ET_FP_DIV;
    case 0xB: /* VSQRT: opc2 0001, opc3 11 */
        if ((hw1 & 0xF) == 1 && ((hw2 >> 6) & 3) == 3)
            return ET_FP_DIV;
        return ET_FP;
    default:
        return ET_FP;
    }
}

/* 32-bit data processing (register): hw1 = 1111 1010 xxxx xxxx. */
static int decode_dp_register(unsigned hw1, unsigned hw2)
{
    unsigned op1 = (hw1 >> 4) & 0xF, op2 = (hw2 >> 4) & 0xF;
    if ((op1 & 0x8) == 0) {
        if (op2 & 0x8) /* extends: SXTAB16/SXTB16 (0010), UXTAB16/UXTB16 (0011); the others plain */
            return (op1 == 0x2 || op1 == 0x3) ? ET_SIMD : ET_OTHER;
        return ET_OTHER; /* LSL, LSR, ASR, ROR (register) */
    }
    if ((op2 & 0x8) == 0) /* parallel add/subtract, signed and unsigned */
        return ET_SIMD;
    if ((op1 & 0xC) == 0x8 && (op2 & 0xC) == 0x8) { /* miscellaneous operations */
        unsigned op = op1 & 3;
        if (op == 0) /* QADD, QDADD, QSUB, QDSUB */
            return ET_SIMD;
        if (op == 2 && (op2 & 3) == 0) /* SEL */
            return ET_SIMD;
    }
    return ET_OTHER;
}

/* The class of one Thumb-2 instruction (`size` 2 or 4 bytes, little-endian halfwords as the
 * plugin API gives them). *words: registers moved by a multiple load/store; *conditional: 1
 * for a conditional branch (the caller counts it taken or not taken at run time; then the
 * class returned is ET_BRANCH_TAKEN); in_it: the instruction is inside an IT block (a branch
 * there is conditional). */
/* The size of the Thumb instruction at bytes: 4 only when its first halfword starts 0b11101,
 * 0b11110 or 0b11111. QEMU can report 4 bytes for a 16-bit instruction whose translation read
 * the next halfword ahead (a page-crossing check at the end of a TB); decoding those 4 bytes as
 * one instruction counted a CMP as a coprocessor store of 47 words. */
EXPORT int et_insn_size(const uint8_t *bytes, int size)
{
    return size == 4 && (bytes[1] >> 3) < 0x1D ? 2 : size;
}

EXPORT int et_decode(const uint8_t *bytes, int size, int in_it, int *words, int *conditional)
{
    size = et_insn_size(bytes, size);
    unsigned hw1 = (unsigned)bytes[0] | ((unsigned)bytes[1] << 8);
    int branch = 0, cls = ET_OTHER;
    *words = 0;
    *conditional = 0;
    if (size == 2) {
        unsigned top6 = hw1 >> 10;
        if (top6 == 0x10) { /* 010000: data processing; MUL is opcode 1101 */
            cls = ((hw1 >> 6) & 0xF) == 0xD ? ET_MUL : ET_OTHER;
        } else if (top6 == 0x11) { /* 010001: special data processing, BX, BLX */
            unsigned op = (hw1 >> 8) & 3;
            unsigned rd = ((hw1 >> 4) & 8) | (hw1 & 7);
            if (op == 3)
                branch = 1;
            else if (op != 1 && rd == 15) /* ADD / MOV to PC */
                branch = 1;
        } else if ((hw1 >> 11) == 0x09) { /* 01001: LDR (literal) */
            cls = ET_LOAD;
        } else if ((hw1 >> 12) == 0x5) { /* 0101: load/store register offset */
            cls = ((hw1 >> 9) & 7) < 3 ? ET_STORE : ET_LOAD;
        } else if ((hw1 >> 13) == 0x3 || (hw1 >> 12) == 0x8 || (hw1 >> 12) == 0x9) {
            /* 011xx STR/LDR(B) immediate, 1000x STRH/LDRH, 1001x SP-relative: bit 11 is L */
            cls = (hw1 & 0x0800) ? ET_LOAD : ET_STORE;
        } else if ((hw1 >> 12) == 0xB) { /* 1011: miscellaneous */
            if ((hw1 & 0xF500) == 0xB100) { /* CBZ, CBNZ */
                branch = 1;
                *conditional = 1;
            } else if ((hw1 & 0xFE00) == 0xB400) { /* PUSH */
                cls = ET_STORE_MULTIPLE;
                *words = popcount16(hw1 & 0x1FF);
            } else if ((hw1 & 0xFE00) == 0xBC00) { /* POP */
                *words = popcount16(hw1 & 0x1FF);
                if (hw1 & 0x100)
                    branch = 1;
                else
                    cls = ET_LOAD_MULTIPLE;
            }
        } else if ((hw1 >> 11) == 0x18) { /* 11000: STM */
            cls = ET_STORE_MULTIPLE;
            *words = popcount16(hw1 & 0xFF);
        } else if ((hw1 >> 11) == 0x19) { /* 11001: LDM */
            cls = ET_LOAD_MULTIPLE;
            *words = popcount16(hw1 & 0xFF);
        } else if ((hw1 >> 12) == 0xD) { /* 1101: B<c>, UDF (1110), SVC (1111) */
            if (((hw1 >> 8) & 0xF) < 0xE) {
                branch = 1;
                *conditional = 1;
            }
        } else if ((hw1 >> 11) == 0x1C) { /* 11100: B */
            branch = 1;
        }
    } else {
        unsigned hw2 = (unsigned)bytes[2] | ((unsigned)bytes[3] << 8);
        unsigned op1 = (hw1 >> 11) & 3, op2 = (hw1 >> 4) & 0x7F;
        if (op1 == 1) {
            if ((op2 & 0x64) == 0x00) { /* load/store multiple */
                int load = hw1 & 0x10;
                *words = popcount16(hw2);
                if (load && (hw2 & 0x8000))
                    branch = 1;
                else
                    cls = load ? ET_LOAD_MULTIPLE : ET_STORE_MULTIPLE;
            } else if ((op2 & 0x64) == 0x04) { /* load/store dual or exclusive, table branch */
                unsigned o1 = (hw1 >> 7) & 3, o2 = (hw1 >> 4) & 3;
                int load = hw1 & 0x10;
                if ((o1 & 2) || (o2 & 2)) { /* LDRD / STRD */
                    *words = 2;
                    cls = load ? ET_LOAD_MULTIPLE : ET_STORE_MULTIPLE;
                } else if (o1 == 0) { /* STREX / LDREX */
                    cls = load ? ET_LOAD : ET_STORE;
                } else if (!load) { /* STREXB / STREXH */
                    cls = ET_STORE;
                } else if (((hw2 >> 4) & 0xE) == 0) { /* TBB / TBH */
                    branch = 1;
                } else { /* LDREXB / LDREXH */
                    cls = ET_LOAD;
                }
            } else if ((op2 & 0x60) == 0x20) { /* data processing (shifted register); PKHBT/PKHTB: op 0110 */
                cls = ((hw1 >> 5) & 0xF) == 0x6 ? ET_SIMD : ET_OTHER;
            } else { /* coprocessor */
                cls = decode_coproc(hw1, hw2, words);
            }
        } else if (op1 == 2) {
            if (hw2 & 0x8000) { /* branches and miscellaneous control */
                unsigned o = (hw2 >> 12) & 5;
                if (o == 0) { /* B<c>.W, or MSR/MRS/hints/barriers when cond is 111x */
                    if (((hw1 >> 7) & 7) != 7) {
                        branch = 1;
                        *conditional = 1;
                    }
                } else { /* B.W, BL */
                    branch = 1;
                }
            } else if (hw1 & 0x0200) { /* plain binary immediate: SSAT, USAT (and their 16-bit forms) */
                unsigned op = (hw1 >> 4) & 0x1F;
                if (op == 0x10 || op == 0x12 || op == 0x18 || op == 0x1A)
                    cls = ET_SIMD;
            }
        } else { /* op1 == 3 */
            if ((op2 & 0x71) == 0x00) { /* store single data item */
                cls = ET_STORE;
            } else if ((op2 & 0x67) == 0x01 || (op2 & 0x67) == 0x03) { /* load byte / halfword; PLD/PLI */
                cls = ((hw2 >> 12) & 0xF) == 0xF ? ET_OTHER : ET_LOAD;
            } else if ((op2 & 0x67) == 0x05) { /* load word */
                if (((hw2 >> 12) & 0xF) == 0xF)
                    branch = 1;
                else
                    cls = ET_LOAD;
            } else if ((op2 & 0x70) == 0x20) { /* data processing (register) */
                cls = decode_dp_register(hw1, hw2);
            } else if ((op2 & 0x78) == 0x30) { /* multiply, multiply accumulate, absolute difference */
                unsigned o = (hw1 >> 4) & 7, ra = (hw2 >> 12) & 0xF;
                switch (o) {
                case 0: cls = (((hw2 >> 4) & 3) == 0 && ra == 15) ? ET_MUL : ET_MAC; break; /* MUL / MLA, MLS */
                case 2: case 4: case 7: cls = ET_SIMD; break; /* SMLAD/SMUAD, SMLSD/SMUSD, USAD8/USADA8 */
                default: cls = ET_MAC; break; /* SMLAxy/SMULxy, SMLAWy/SMULWy, SMMLA/SMMUL, SMMLS */
                }
            } else if ((op2 & 0x78) == 0x38) { /* long multiply, long multiply accumulate, divide */
                unsigned o = (hw1 >> 4) & 7, o2 = (hw2 >> 4) & 0xF;
                if (o2 == 0xF)
                    cls = ET_DIV; /* SDIV (001), UDIV (011) */
                else if ((o == 4 && (o2 & 0xC) == 0xC) || o == 5)
                    cls = ET_SIMD; /* SMLALD, SMLSLD */
                else
                    cls = ET_MAC; /* SMULL, UMULL, SMLAL, SMLALxy, UMLAL, UMAAL */
            } else if (op2 & 0x40) { /* coprocessor */
                cls = decode_coproc(hw1, hw2, words);
            }
        }
    }
    if (branch) {
        if (in_it)
            *conditional = 1;
        return ET_BRANCH_TAKEN;
    }
    return cls;
}

/* IT's mask (hw1[3:0]) nonzero: the number of instructions its block holds. */
static int it_block_length(const uint8_t *bytes, int size)
{
    unsigned hw1 = (unsigned)bytes[0] | ((unsigned)bytes[1] << 8);
    if (size != 2 || (hw1 & 0xFF00) != 0xBF00 || (hw1 & 0xF) == 0)
        return 0;
    return 4 - __builtin_ctz(hw1 & 0xF);
}

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
        int block = it_block_length(bytes, size);
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
