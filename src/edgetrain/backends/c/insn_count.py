"""Instructions a user-mode QEMU guest executes: a small TCG plugin (PLUGIN_SOURCE) built for the
host with its C compiler into the cache ("qemu" folder, keyed by the source's hash) and loaded by
qemu-aarch64 (or any qemu-<arch> user-mode emulator) with `-plugin`; at exit it writes
`et_insns <count>` to QEMU's log (`-d plugin -D <file>`).

Debian's qemu-user (7.2) is built with plugin support but ships no plugins and no qemu-plugin.h:
the source declares the five API functions it calls (QEMU's plugin API version 1, as in QEMU 4.2 to
8.x; runtime/cortexm/icount_plugin.c, the Cortex-M counter that classifies Thumb-2 instructions,
does the same). The count is of translation blocks entered times their instructions: a block left
early by a signal still counts whole (training code raises none).

Instructions per training step come from two runs of the same binary: (count with --steps b - count
with --steps a) / (b - a): start-up, loading the weights and the exit cancel out; each step's own
printing (two lines) and the checked step's backup stay in (cross.py per_step_instructions)."""
from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import Sequence

from .cache import cache_path
from .layout import CBackendError
from .toolchain import host_compiler, run_tool

PLUGIN_SOURCE = r"""/* edgetrain: count the guest instructions a user-mode QEMU executes (insn_count.py) */
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
typedef uint64_t qemu_plugin_id_t;
typedef struct qemu_info_t qemu_info_t;
struct qemu_plugin_tb;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void *userdata);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb, enum qemu_plugin_op op, void *ptr,
                                              uint64_t imm);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void *userdata);
void qemu_plugin_outs(const char *string);

#define EXPORT __attribute__((visibility("default")))
EXPORT int qemu_plugin_version = 1;
static uint64_t et_insns; /* one guest thread: the trainer runs on one */

static void et_tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    (void)id;
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &et_insns, qemu_plugin_tb_n_insns(tb));
}

static void et_exit(qemu_plugin_id_t id, void *p) {
    char line[64];
    (void)id, (void)p;
    snprintf(line, sizeof line, "et_insns %" PRIu64 "\n", et_insns);
    qemu_plugin_outs(line);
}

EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv) {
    (void)info, (void)argc, (void)argv;
    qemu_plugin_register_vcpu_tb_trans_cb(id, et_tb_trans);
    qemu_plugin_register_atexit_cb(id, et_exit, NULL);
    return 0;
}
"""
_COUNT_RE = re.compile(r"^et_insns (\d+)$", re.M)


def plugin_path() -> Path:
    """The plugin, built with the host C compiler into the cache once per source."""
    digest = hashlib.sha256(PLUGIN_SOURCE.encode()).hexdigest()[:16]
    cache = cache_path("qemu")
    so = cache / f"qemu-insns-{digest}.so"
    if so.exists():
        return so
    cc = host_compiler()
    if cc is None:
        raise CBackendError("counting instructions needs a host C compiler (cc) to build the QEMU plugin")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as work:
        src = Path(work) / "insns.c"
        src.write_text(PLUGIN_SOURCE)
        tmp = Path(work) / "insns.so"
        r = run_tool([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(src)], Path(work), 120)
        if r.returncode != 0:
            raise CBackendError(f"building the QEMU instruction-count plugin failed:\n{r.stderr}")
        os.replace(tmp, so)
    return so


def counted_command(emulator: str, argv: Sequence[str], log: Path) -> list[str]:
    """`emulator argv...` with the plugin loaded, its count written to `log`."""
    return [emulator, "-plugin", str(plugin_path()), "-d", "plugin", "-D", str(log), *argv]


def read_count(log: Path) -> int:
    """The count the plugin wrote to `log` (CBackendError when it wrote none)."""
    text = log.read_text() if log.exists() else ""
    m = _COUNT_RE.findall(text)
    if not m:
        raise CBackendError(f"the QEMU instruction-count plugin wrote no count to {log} ({text[-300:]!r})")
    return int(m[-1])
