/* The RV32 decoder of the instruction-count plugin (runtime/icount_plugin.c includes the decoder
 * of its target's runtime folder: this one for RISC-V, runtime/cortexm/icount_decode.h for
 * Thumb-2). It classifies one RV32IMFC(V) instruction into cycles.py's CLASSES:
 *   load:  LB, LH, LW, LBU, LHU, C.LW, C.LWSP        store: SB, SH, SW, C.SW, C.SWSP
 *   mul:   MUL                                       mac:   MULH, MULHSU, MULHU (the upper word,
 *                                                           as Arm's long multiplies are "mac")
 *   div:   DIV, DIVU, REM, REMU
 *   branch_taken: JAL, JALR, C.J, C.JAL, C.JR, C.JALR, and BEQ..BGEU, C.BEQZ, C.BNEZ when taken
 *   branch_not_taken: BEQ..BGEU, C.BEQZ, C.BNEZ not taken (decided at run time: *conditional)
 *   fp: the F extension's arithmetic but divide and square root (FADD, FSUB, FMUL, FMIN/FMAX,
 *       FSGNJ*, FCVT, FMV, FEQ/FLT/FLE, FCLASS)   fp_mac: FMADD, FMSUB, FNMSUB, FNMADD
 *   fp_div: FDIV, FSQRT      fp_load: FLW, FLD, C.FLW(SP), C.FLD(SP)      fp_store: FSW, FSD, ...
 *   simd: the V extension (OP-V, and vector loads / stores: LOAD-FP / STORE-FP of another width)
 *   other: everything else (RV32I arithmetic, LUI, AUIPC, CSR, FENCE, ECALL, C.ADDI, C.MV, ...)
 * RV32 has no multiple loads / stores: `words` stays 0. No IT blocks (et_it_block_length: 0).
 * The classes' enum (et_class) is defined before this file is included. */
#ifndef ET_ICOUNT_DECODE_RISCV_H
#define ET_ICOUNT_DECODE_RISCV_H

#include <stdint.h>

/* The size of the instruction at bytes: 4 when its low two bits are 11, else 2 (compressed). */
EXPORT int et_insn_size(const uint8_t *bytes, int size)
{
    (void)size;
    return (bytes[0] & 3) == 3 ? 4 : 2;
}

static int decode_compressed(unsigned h, int *conditional)
{
    unsigned quadrant = h & 3, f3 = h >> 13;
    if (quadrant == 0) {
        static const int q0[8] = {ET_OTHER, ET_FP_LOAD, ET_LOAD, ET_FP_LOAD,
                                  ET_OTHER, ET_FP_STORE, ET_STORE, ET_FP_STORE};
        return q0[f3]; /* C.ADDI4SPN, C.FLD, C.LW, C.FLW, (reserved), C.FSD, C.SW, C.FSW */
    }
    if (quadrant == 1) {
        if (f3 == 1 || f3 == 5) /* C.JAL (RV32), C.J */
            return ET_BRANCH_TAKEN;
        if (f3 == 6 || f3 == 7) { /* C.BEQZ, C.BNEZ */
            *conditional = 1;
            return ET_BRANCH_TAKEN;
        }
        return ET_OTHER;
    }
    switch (f3) { /* quadrant 2 */
    case 1: case 3:
        return ET_FP_LOAD; /* C.FLDSP, C.FLWSP */
    case 2:
        return ET_LOAD; /* C.LWSP */
    case 5: case 7:
        return ET_FP_STORE; /* C.FSDSP, C.FSWSP */
    case 6:
        return ET_STORE; /* C.SWSP */
    case 4: {
        unsigned rs1 = (h >> 7) & 0x1F, rs2 = (h >> 2) & 0x1F;
        if (rs2 == 0 && rs1 != 0) /* C.JR (bit 12 clear), C.JALR (set) */
            return ET_BRANCH_TAKEN;
        return ET_OTHER; /* C.MV, C.ADD, C.EBREAK */
    }
    default:
        return ET_OTHER; /* C.SLLI */
    }
}

/* The class of one instruction (`size` as the plugin API gives it); *conditional: 1 for a
 * conditional branch (counted taken or not at run time; the class returned is then
 * ET_BRANCH_TAKEN); in_it is Thumb's and ignored here. */
EXPORT int et_decode(const uint8_t *bytes, int size, int in_it, int *words, int *conditional)
{
    (void)in_it;
    *words = 0;
    *conditional = 0;
    if (et_insn_size(bytes, size) == 2)
        return decode_compressed((unsigned)bytes[0] | ((unsigned)bytes[1] << 8), conditional);
    uint32_t w = (uint32_t)bytes[0] | ((uint32_t)bytes[1] << 8) | ((uint32_t)bytes[2] << 16) |
                 ((uint32_t)bytes[3] << 24);
    unsigned opcode = w & 0x7F, f3 = (w >> 12) & 7, f7 = w >> 25;
    switch (opcode) {
    case 0x03:
        return ET_LOAD;
    case 0x23:
        return ET_STORE;
    case 0x07: /* LOAD-FP: FLH/FLW/FLD/FLQ at widths 1-4, a vector load at 0 and 5-7 */
        return (f3 >= 1 && f3 <= 4) ? ET_FP_LOAD : ET_SIMD;
    case 0x27:
        return (f3 >= 1 && f3 <= 4) ? ET_FP_STORE : ET_SIMD;
    case 0x33: /* OP: the M extension at funct7 = 1 */
        if (f7 != 1)
            return ET_OTHER;
        return f3 == 0 ? ET_MUL : f3 <= 3 ? ET_MAC : ET_DIV;
    case 0x63: /* BRANCH */
        *conditional = 1;
        return ET_BRANCH_TAKEN;
    case 0x67: case 0x6F: /* JALR, JAL */
        return ET_BRANCH_TAKEN;
    case 0x43: case 0x47: case 0x4B: case 0x4F: /* FMADD, FMSUB, FNMSUB, FNMADD */
        return ET_FP_MAC;
    case 0x53: { /* OP-FP: funct5 0x03 FDIV, 0x0B FSQRT */
        unsigned f5 = w >> 27;
        return (f5 == 0x03 || f5 == 0x0B) ? ET_FP_DIV : ET_FP;
    }
    case 0x57: /* OP-V */
        return ET_SIMD;
    default:
        return ET_OTHER;
    }
}

/* RISC-V has no IT blocks. */
static int et_it_block_length(const uint8_t *bytes, int size)
{
    (void)bytes;
    (void)size;
    return 0;
}

#endif
