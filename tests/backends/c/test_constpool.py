"""constpool.ConstPool: the kernels' block-scoped constant tables moved to file scope, each once,
without changing what any name in a block means."""
import re
import subprocess

import pytest

from edgetrain.backends.c.constpool import ConstPool
from edgetrain.backends.c.host import find_cc

CONV = """{
    static const int32_t P_m[2] = {1073741824, 1500000000};
    static const int8_t P_s[2] = {-3, -4};
    static const conv_p P = {2, 3, P_m, P_s};
    run(&P, P_m[1], P.c);
}"""


def test_equal_tables_are_emitted_once_and_blocks_use_the_shared_names():
    pool = ConstPool()
    a, b = pool.hoist(CONV), pool.hoist(CONV.replace("run(", "run2("))
    decls = pool.declarations()
    assert len(decls) == 3  # P_m, P_s and the struct naming them: once for both blocks
    assert "static const" not in a and "static const" not in b
    m, s, p = (re.search(r"(et_c\d+_\w+)", d).group(1) for d in decls)
    assert decls[2] == f"static const conv_p {p} = {{2, 3, {m}, {s}}};"
    assert f"run(&{p}, {m}[1], {p}.c);" in a and f"run2(&{p}, {m}[1], {p}.c);" in b


def test_different_values_get_different_tables():
    pool = ConstPool()
    pool.hoist(CONV)
    pool.hoist(CONV.replace("-3, -4", "-3, -5"))
    assert len(pool) == 5  # P_s twice, so P (which names it) twice; P_m once


def test_a_struct_field_of_the_same_name_is_not_renamed():
    code = "{\n    static const float SC[1] = {1.0f};\n    q.SC = SC[0]; p->SC = SC[0];\n}"
    out = ConstPool().hoist(code)
    assert "q.SC = et_c0_SC[0]; p->SC = et_c0_SC[0];" in out


@pytest.mark.parametrize("code", [
    # declared twice in one block (two scopes): hoisting could not tell the uses apart
    "{\n  { static const int T[1] = {1}; f(T); }\n  { static const int T[1] = {2}; f(T); }\n}",
    # used before its declaration: an outer name that the declaration shadows
    "{\n  f(T);\n  { static const int T[1] = {1}; f(T); }\n}",
])
def test_a_declaration_whose_name_is_ambiguous_stays(code):
    pool = ConstPool()
    assert pool.hoist(code) == code and len(pool) == 0


def test_a_struct_naming_a_table_that_stays_stays_too():
    code = ("{\n  f(A);\n  { static const int A[1] = {1};\n    static const conv_p P = {A};\n"
            "    static const int B[1] = {2};\n    g(&P, B); }\n}")
    pool = ConstPool()
    out = pool.hoist(code)
    assert "static const int A[1]" in out and "static const conv_p P = {A};" in out
    assert pool.declarations() == ["static const int et_c0_B[1] = {2};"] and "g(&P, et_c0_B)" in out


def test_the_hoisted_program_compiles_and_computes_the_same(tmp_path):
    """The block and its hoisted form in one C program give the same result."""
    pool = ConstPool()
    hoisted = pool.hoist(CONV)
    src = "\n".join(["#include <stdint.h>", "#include <stdio.h>",
                     "typedef struct { int n, c; const int32_t *m; const int8_t *s; } conv_p;",
                     "static long acc;",
                     "static void run(const conv_p *p, int32_t m, int c) { acc += (long)p->m[0] + p->s[1] + m + c + p->n; }",
                     *pool.declarations(),
                     "static long before(void) { acc = 0; " + CONV + " return acc; }",
                     "static long after(void) { acc = 0; " + hoisted + " return acc; }",
                     'int main(void) { printf("%ld %ld\\n", before(), after()); return 0; }'])
    (tmp_path / "t.c").write_text(src)
    subprocess.run([find_cc(), "-std=gnu11", "-Wall", "-Werror", "-o", str(tmp_path / "t"), str(tmp_path / "t.c")],
                   check=True)
    a, b = subprocess.run([str(tmp_path / "t")], capture_output=True, text=True, check=True).stdout.split()
    assert a == b == str(1073741824 - 4 + 1500000000 + 3 + 2)
