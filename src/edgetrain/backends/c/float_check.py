"""Whether a firmware ELF computes with floats: the integer-only training step's proof
(backward="integer": no float instruction on a core without an FPU).

Two signs of float arithmetic, either of which counts:
- a soft-float routine of libgcc linked in (`__addsf3`, `__mulsf3`, `__floatsisf`,
  `__aeabi_fmul`, ...): how a core without an FPU computes a float operation;
- an FPU instruction in the code (RISC-V F/D: `fadd.s`, `flw`, `fmv.w.x`, ...; Arm: `vmul.f32`,
  `vcvt`, `vldr` of an s/d register, ...): how a core with one does.
"""
from __future__ import annotations

import re
from pathlib import Path

from .cycles import function_symbols
from .stack_bound import disassemble

#: libgcc's soft-float routines (single and double; GNU names and the Arm EABI ones)
_SOFT_FLOAT = re.compile(r"^__(?:(?:add|sub|mul|div|neg|eq|ne|lt|le|gt|ge|unord|cmp)[sd]f[23]|"
                         r"float(?:un)?[sdt]i[sd]f|fix(?:uns)?[sd]f[sdt]i|extendsfdf2|truncdfsf2|"
                         r"aeabi_[fd](?:add|sub|mul|div|rsub|cmp\w*|2\w+)|aeabi_[iu]?[il]2[fd]|aeabi_[fd]2\w+)$")
#: an FPU instruction in `objdump -d --no-show-raw-insn` output: RISC-V F/D mnemonics (f-prefixed
#: with a .s/.d/.w/.x suffix, flw/fsw/fld/fsd, frcsr/fscsr) or Arm VFP/MVE float mnemonics
_FPU_INSN = re.compile(r"^\s*[0-9a-f]+:\s+(?:f[a-z.]*\.(?:s|d|w|x|wu|l|lu)\b|f(?:lw|sw|ld|sd|rcsr|scsr|rrm|srm)\b|"
                       r"v[a-z]*\.f(?:16|32|64)\b|vcvt\w*\.f|vldr\s+[sd]\d|vstr\s+[sd]\d|vmov\s+[sd]\d|vmov\s+\w+,\s*[sd]\d)")


def float_uses(elf: Path) -> list[str]:
    """What in `elf` computes with floats: the soft-float routines it links (its code symbols,
    one name per address), then the first FPU instructions of its code (at most 5 of them, with
    their addresses); empty: integers only."""
    found = sorted({name for _, _, name in function_symbols(elf) if _SOFT_FLOAT.match(name)})
    insns = [ln.strip() for ln in disassemble(elf).splitlines() if _FPU_INSN.match(ln)]
    return found + insns[:5]
