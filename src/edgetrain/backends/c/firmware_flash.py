"""What the flash of a linked firmware holds, by kind, read from its symbols.

cortexm.firmware_size says how big the flash image is; this says what it is made of, so that
it can be compared with the weights: a training firmware's flash is at least its weights
(the frozen ones `const`, the trained ones' initial values in the .data image), and the rest
is what the program adds to them. The embedded training samples are counted apart: they are
test data that a device reads from its sensor. So are the int8 layers' per-channel requantization
arrays (an int32 multiplier and an int8 shift per output channel, or one word a channel where the
layer's shifts pack into its multipliers: kernels/int8_params.py's `requant_decls`): numbers of the
model, as many as its channels, which no kernel can do without. The integer backward's own gradient
multipliers (kernels/int8_igrad.py's MULT / SHIFT) are not among them: they count as constants.

Symbols are classified by name and section type (`nm -S` of the ELF's toolchain): the state arrays
are emit.py's `et_s<k>_<name>` (layout.StateArray), the samples samples.h's `et_sample_*`,
and model.o's own symbols (its code and its read-only tables) are told apart from the rest
(startup, board, main, newlib, libgcc) by the names model.o defines. Bytes without a symbol
(alignment, anonymous string literals) count as "other"."""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .cortexm_target import BUILD_DIR, elf_toolchain
from .kernels.int8_params import MULT, SHIFT

#: a state tensor's array (layout.StateArray.c_name, `_sel` / `_rest` for a split one)
STATE = re.compile(r"^et_s\d+_")
#: a split tensor's channel index arrays: metadata, not weights
STATE_INDEX = re.compile(r"_(si|ri)$")
#: the embedded training samples (project.samples_source)
SAMPLE = re.compile(r"^et_sample_(input|label)$")
#: a layer's requantization multipliers or shifts (constpool.py hoists them as et_c<k>_<name>_m / _s)
REQUANT = re.compile(rf"^et_c\d+_\w+({MULT}|{SHIFT})$")
#: nm's section letters of what occupies flash: code, read-only data, the .data image
CODE, RODATA, DATA = "tT", "rR", "dD"


@dataclass(frozen=True)
class FlashContents:
    """Bytes of a firmware's flash by kind; `total` is cortexm.firmware_size's flash."""
    total: int
    frozen_weights: int  # state arrays in read-only data: frozen weights (and the rest of split ones)
    trained_weights: int  # the initial values of the trained state arrays (the .data image)
    samples: int  # the embedded training samples
    requant: int  # the int8 layers' per-channel requantization multipliers and shifts
    constants: int  # model.o's other read-only data: the kernels' tables, index maps, names
    model_code: int  # model.o's code: the graphs and the kernels they call
    other: int  # the rest: startup, board, main, newlib and libgcc, alignment

    @property
    def weights(self) -> int:
        """Every weight the flash holds: frozen, and the trained ones' initial values."""
        return self.frozen_weights + self.trained_weights

    @property
    def without_samples(self) -> int:
        return self.total - self.samples

    @property
    def program(self) -> int:
        """Everything but the weights and the samples: the code, the requantization arrays, the other
        tables, and the rest."""
        return self.total - self.weights - self.samples

    def as_dict(self) -> dict:
        return {"total": self.total, "frozen_weights": self.frozen_weights, "trained_weights": self.trained_weights,
                "samples": self.samples, "requant": self.requant, "constants": self.constants, "model_code": self.model_code,
                "other": self.other}


def _symbols(path: Path) -> list[tuple[int, int, str, str]]:
    """(address, size, nm section letter, name) of the defined symbols with a size."""
    nm = elf_toolchain(path).tool("nm")
    r = subprocess.run([nm, "-S", "-t", "d", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{nm} failed on {path}: {r.stderr.strip()}")
    out = []
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4:
            out.append((int(parts[0]), int(parts[1]), parts[2], parts[3]))
    return out


def _flash_symbols(out_dir: Path):
    """(kind, name, size) of each symbol that firmware.elf's flash holds, once per address, `kind` one of
    FlashContents' fields (all but `other`: the bytes no such symbol claims)."""
    model_names = {name for _, _, _, name in _symbols(out_dir / BUILD_DIR / "model.o")}
    seen = set()  # addresses counted: the linker's identical-constant folding leaves two names on one table
    for address, size, letter, name in _symbols(out_dir / "firmware.elf"):
        if letter not in CODE + RODATA + DATA or address in seen:
            continue
        seen.add(address)
        if SAMPLE.match(name):
            yield "samples", name, size
        elif STATE.match(name) and not STATE_INDEX.search(name) and letter not in CODE:
            yield ("frozen_weights" if letter in RODATA else "trained_weights"), name, size
        elif name in model_names:
            yield ("model_code" if letter in CODE else "requant" if REQUANT.match(name) else "constants"), name, size


def flash_contents(out_dir, total: int) -> FlashContents:
    """The flash of out_dir/firmware.elf (linked from out_dir/build/model.o among others) by kind;
    `total`: its flash bytes (cortexm.firmware_size(elf).flash)."""
    kinds = dict.fromkeys(("frozen_weights", "trained_weights", "samples", "requant", "constants", "model_code"), 0)
    for kind, _, size in _flash_symbols(Path(out_dir)):
        kinds[kind] += size
    return FlashContents(total=total, other=total - sum(kinds.values()), **kinds)


def model_functions(out_dir) -> dict[str, int]:
    """{function: its code bytes in out_dir/firmware.elf} of model.o's functions (the graphs and the
    kernels they call), largest first: FlashContents.model_code by function (the two add up to the same
    bytes). The names are the ELF's, as the instruction counts name them (a clone's `.constprop.0` kept)."""
    sizes = [(name, size) for kind, name, size in _flash_symbols(Path(out_dir)) if kind == "model_code"]
    return dict(sorted(sizes, key=lambda t: (-t[1], t[0])))
