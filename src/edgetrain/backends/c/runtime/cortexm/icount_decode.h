/* The Thumb-2 decoder of the instruction-count plugin (runtime/cortexm/icount_plugin.c includes
 * the decoder of its target's runtime folder: this one for the Cortex-M, runtime/riscv/ has
 * RV32's). It classifies one instruction into cycles.py's CLASSES (the plugin's enum et_class,
 * defined before this file is included) and tells IT blocks' lengths. */
#ifndef ET_ICOUNT_DECODE_THUMB_H
#define ET_ICOUNT_DECODE_THUMB_H

#include <stdint.h>

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
static int et_it_block_length(const uint8_t *bytes, int size)
{
    unsigned hw1 = (unsigned)bytes[0] | ((unsigned)bytes[1] << 8);
    if (size != 2 || (hw1 & 0xFF00) != 0xBF00 || (hw1 & 0xF) == 0)
        return 0;
    return 4 - __builtin_ctz(hw1 & 0xF);
}

#endif
