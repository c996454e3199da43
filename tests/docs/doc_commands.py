"""Extract the commands README.md and docs/*.md show, for tests/docs/test_doc_commands.py.

What counts as a command (the rule the test states):
- every line of a ```bash / ```sh / ```shell / ```console fenced block (a `$ ` prompt dropped, a
  trailing `\\` joining the next line, a `# comment` dropped), split at `&&`;
- an inline code span that starts with `edgetrain `, `pip install ` or `python -m edgetrain`
  (outside fenced blocks; a span may wrap over one line break).
A fenced block without a language whose lines start like a command is an error (tag it bash).
Python blocks (```python) are collected whole."""
from __future__ import annotations

import builtins
import re
import symtable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELL_LANGS = ("bash", "sh", "shell", "console")
#: how a line of an untagged block that is a command starts
LOOKS_LIKE_COMMAND = re.compile(r"^(\$ )?(edgetrain|pip3?|python3?|pytest|make|PYTHONPATH=|\.ci/run)\b")
INLINE = re.compile(r"^(edgetrain |pip install |python -m edgetrain)")
#: a placeholder in a command: an upper-case metavariable (MODEL, N, DIR), alternatives, an
#: optional part or an ellipsis; such a span is syntax, not a command one can run
PLACEHOLDER = re.compile(r"(?<![\w.])[A-Z][A-Z_]*(?![\w.])|\||\[|…|\.\.\.")
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class DocCommand:
    doc: str   # path relative to the repository root
    line: int
    text: str  # whitespace collapsed
    inline: bool

    @property
    def template(self) -> bool:
        """An inline span with a placeholder (quoted text aside): syntax, not a command to run."""
        return self.inline and bool(PLACEHOLDER.search(re.sub(r'"[^"]*"', "", self.text)))

    @property
    def name_only(self) -> bool:
        """`edgetrain SUB` in prose: the name of a subcommand, not a command line."""
        words = self.text.split()
        return self.inline and len(words) == 2 and words[0] == "edgetrain" and words[1].isalpha()

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


@dataclass(frozen=True)
class PythonBlock:
    doc: str
    line: int
    source: str

    def free_names(self) -> set[str]:
        """Names the block reads but never binds (not builtins): none for a complete program."""
        free: set[str] = set()

        def walk(table):
            for sym in table.get_symbols():
                if (sym.is_referenced() and (sym.is_global() or table.get_type() == "module")
                        and not sym.is_assigned() and not sym.is_imported() and not hasattr(builtins, sym.get_name())):
                    free.add(sym.get_name())
            for child in table.get_children():
                walk(child)

        top = symtable.symtable(self.source, f"{self.doc}:{self.line}", "exec")
        walk(top)
        bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
        return free - bound


def docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _lineno(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _block_commands(body: str, doc: str, first: int) -> list[DocCommand]:
    out, pending, start = [], "", None
    for i, raw in enumerate(body.splitlines()):
        line = raw.strip()
        if start is None:
            start = first + i
        if line.startswith("$ "):
            line = line[2:]
        line = re.sub(r"(^|\s)#.*$", "", line).rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole, pending = (pending + line).strip(), ""
        for part in whole.split("&&"):
            if part.strip():
                out.append(DocCommand(doc, start, " ".join(part.split()), False))
        start = None
    return out


def extract(paths=None) -> tuple[list[DocCommand], list[PythonBlock], list[str]]:
    """(commands, python blocks, errors: untagged blocks that hold commands)."""
    commands, blocks, errors = [], [], []
    for path in paths or docs():
        text, doc = path.read_text(), str(path.relative_to(ROOT))
        for m in FENCE.finditer(text):
            lang, body, first = m.group(1), m.group(2), _lineno(text, m.start(2))
            if lang in SHELL_LANGS:
                commands += _block_commands(body, doc, first)
            elif lang == "python":
                blocks.append(PythonBlock(doc, first, body))
            elif lang == "" and any(LOOKS_LIKE_COMMAND.match(line.strip()) for line in body.splitlines()):
                errors.append(f"{doc}:{first - 1}: a fenced block of commands without a language: tag it ```bash")
        prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        for m in re.finditer(r"`([^`]+)`", prose):
            span = m.group(1)
            if span.count("\n") <= 1 and INLINE.match(span):
                commands += [DocCommand(doc, _lineno(prose, m.start()), " ".join(part.split()), True)
                             for part in span.split("&&")]
    return commands, blocks, errors
