"""Two weight banks (emit option weight_banks=2; runtime/et_bank.h): the trained state
twice, a step updating a copy of the committed bank and committing it by one header word
after its CRC-32, so that a reset mid-step resumes from the last complete update."""
from __future__ import annotations

from ...ir import Role
from .cvalues import fmt_values, split_parts
from .layout import Layout

def bank_arrays(layout: Layout, state: dict, embed: bool) -> list:
    """(array name, C type, elements, initial values or None) of the trained state: the arrays
    a training step updates in place (trainable weights, split weights' selected part, momentum)."""
    out = []
    for st in layout.states.values():
        if st.kind == "sram":
            init = state[st.name] if embed and st.role is not Role.OPTIMIZER_STATE else None
            out.append((st.c_name, st.ctype, st.numel, init))
        elif st.kind == "split":
            sel, _ = split_parts(st, state[st.name])
            out.append((st.sram, st.ctype, sel.size, sel if embed else None))
    return out


BANK_FUNCS = """
static uint32_t et_bank_crc(int b, int32_t step) {
  return et_crc32(et_crc32(0, et_banks[b], sizeof(et_bank_t)), &step, sizeof step);
}
static int et_bank_valid(int b) {
  return et_bank_meta[b].step >= 0 && et_bank_meta[b].crc == et_bank_crc(b, et_bank_meta[b].step);
}
/* make bank b (complete) the committed one, holding `step` steps: its metadata, then the header word */
static void et_bank_commit(int b, int32_t step) {
  et_bank_meta[b].step = step;
  et_bank_meta[b].crc = et_bank_crc(b, step);
  ET_BANK_BARRIER();
  et_bank_header = ET_BANK_MAGIC | (uint32_t)b; /* the commit: one word */
  ET_BANK_BARRIER();
  et_bank_active = b;
  et_bank_cur = et_banks[b];
}
/* boot / resume: the header's bank if its checksum holds, else the other bank if its checksum
   holds (the newer when both do); returns the bank (et_step restored), or -1: nothing valid */
int et_bank_boot(void) {
  const uint32_t h = et_bank_header;
  int b = -1;
  if ((h & ~1u) == ET_BANK_MAGIC && et_bank_valid((int)(h & 1u))) {
    b = (int)(h & 1u);
  } else {
    const int v0 = et_bank_valid(0), v1 = et_bank_valid(1);
    if (v0 && v1) b = et_bank_meta[1].step > et_bank_meta[0].step;
    else if (v0 || v1) b = v1;
    if (b >= 0) et_bank_header = ET_BANK_MAGIC | (uint32_t)b; /* repair the header */
  }
  if (b < 0) return -1;
  et_bank_active = b;
  et_bank_cur = et_banks[b];
  et_step = et_bank_meta[b].step;
  return b;
}
/* commit the state as it is now (after et_set_state / et_set_step) into the other bank */
void et_bank_format(void) {
  const int w = 1 - et_bank_active;
  et_bank_meta[w].step = -1;
  if (et_banks[w] != et_bank_cur) memcpy(et_banks[w], et_bank_cur, sizeof(et_bank_t));
  et_bank_commit(w, et_step);
}
int et_bank_active_index(void) { return et_bank_active; }
void *et_bank_ptr(int b) { return b == 0 || b == 1 ? (void *)et_banks[b] : 0; }
long et_bank_bytes(void) { return (long)sizeof(et_bank_t); }
"""


def bank_decls(arrays: list) -> list[str]:
    c = ["/* weight banks (weight_banks=2, runtime/et_bank.h): the trained state twice; the kernels reach it",
         "   through et_bank_cur (the names below), which points at the committed bank between steps and at",
         "   the copy being updated during one. On Cortex-M both banks, their metadata and the header sit in",
         "   .noinit (ET_NOINIT): RAM that neither the reset handler nor a system reset clears, so a reboot",
         "   resumes from the committed bank (QEMU keeps it across a reset; on a device it would be backup",
         "   SRAM, or flash with a flash driver). The initial weights are a const image in flash. */",
         "typedef struct {"]
    for k, (_, t, n, _) in enumerate(arrays):
        c.append(f"  {t} a{k}[{max(n, 1)}] ET_ALIGNED(16);")
    c.append("} et_bank_t;")
    inits = [f"  .a{k} = {fmt_values(init)}" for k, (_, _, _, init) in enumerate(arrays)
             if init is not None and init.size]
    if inits:
        c.append("static const et_bank_t et_bank_init ET_ALIGNED(16) = {\n" + ",\n".join(inits)
                 + "\n}; /* the initial weights (flash) */")
    c += ["ET_NOINIT static et_bank_t et_bank0 ET_ALIGNED(16);",
          "ET_NOINIT static et_bank_t et_bank1 ET_ALIGNED(16); /* the second bank: its SRAM is the extra cost */",
          "static et_bank_t *const et_banks[2] = {&et_bank0, &et_bank1};",
          "static et_bank_t *et_bank_cur = &et_bank0;",
          "static int et_bank_active;",
          "ET_NOINIT static et_bank_meta_t et_bank_meta[2];",
          "ET_NOINIT static volatile uint32_t et_bank_header; /* ET_BANK_MAGIC | committed bank */"]
    for k, (name, _, _, _) in enumerate(arrays):
        c.append(f"#define {name} (et_bank_cur->a{k})")
    return c


def bank_fresh_start(arrays: list) -> list[str]:
    """et_init's lines for a fresh start (no valid bank): bank 0 gets the initial weights."""
    has_init = any(init is not None and init.size for _, _, _, init in arrays)
    return ["  /* fresh start: bank 0 holds the initial weights */",
            "  et_bank_cur = et_banks[0];",
            "  memcpy(et_bank_cur, &et_bank_init, sizeof(et_bank_t));" if has_init else
            "  memset(et_bank_cur, 0, sizeof(et_bank_t));"]


BANK_API = """#define ET_WEIGHT_BANKS 2
/* weight banks (et_bank.h): et_init resumes from the committed bank when one is valid */
int et_bank_boot(void);
void et_bank_format(void);
int et_bank_active_index(void);
void *et_bank_ptr(int b);
long et_bank_bytes(void);
#ifdef ET_BANK_TEST_HOOKS
void et_test_abort_after_node(int k);
#endif"""
