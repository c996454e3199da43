"""Which model file a checkpoint may run: loading a checkpoint never executes code that the
user did not name for this run.

A checkpoint of a program compiled from a model file records the file's path, the sha256 of
its text and the text itself. Rebuilding the program (`train --resume / --init`, `export`,
`Checkpoint.restore`) calls that file's factory, i.e. executes Python code, while a checkpoint
is data that may come from anyone: its header alone never makes edgetrain run a file. The
file runs when

- the user names it (`--model-file PATH`, `restore(model_file=PATH)`) and the sha256 of its
  text equals the recorded one (a checkpoint written before the sha256 was recorded: the
  named file runs as it is, since the user chose it), or
- the user trusts the checkpoint (`--trust-model-file`, `restore(trust=True)`): the file named
  (or else the one at the recorded absolute path) runs whatever its text.

Otherwise an UntrustedModelError (a ValueError: exit 2) names the file and what to pass. The
text that runs is the text that was hashed: the file is read once. (Modules the model file
imports from its folder are not covered by the hash: naming the file vouches for them.)"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from .usermodel import ModelLoadError, ModelSource, parse_model_spec, read_model_source

#: how many hex digits of a sha256 the messages show (enough to tell two files apart by eye)
SHOWN_DIGITS = 16


class UntrustedModelError(ModelLoadError):
    """A checkpoint names a model file the user has neither named nor trusted for this run,
    or the file named is not the one the checkpoint was compiled from."""


def trusted_source(ck, model_file=None, trust: bool = False) -> Optional[ModelSource]:
    """The model file text that rebuilding checkpoint `ck` may run (None: a zoo model, which
    runs no user code). `model_file`: the path (or path:FACTORY) the user named."""
    where = f"checkpoint {ck.path}" if ck.path is not None else "the checkpoint"
    config = ck.config
    spec = parse_model_spec(config.model)  # runs nothing
    if not spec.is_file:
        if model_file is not None:
            raise ModelLoadError(f"--model-file {model_file}: {where} was compiled from the zoo model "
                                 f"{config.model}, which needs no model file")
        return None
    recorded = config.model.rpartition(":")[0]
    if model_file is not None:
        source = read_model_source(_named_path(model_file, spec.name))
        if not trust and config.model_sha256 is not None and source.sha256 != config.model_sha256:
            raise UntrustedModelError(
                f"--model-file {source.path} is not the model file {where} was compiled from ({recorded}): "
                f"its sha256 is {source.sha256[:SHOWN_DIGITS]}..., the checkpoint records "
                f"{config.model_sha256[:SHOWN_DIGITS]}...{_first_difference(ck.model_source, source.text)}; pass "
                f"the original file, or add --trust-model-file to run this one (the weights must still fit it)")
        return source
    if trust:
        if not Path(recorded).is_absolute():
            raise UntrustedModelError(f"{where} names the model file {recorded!r} by a relative path, which "
                                      f"would depend on the current folder: name the file with --model-file PATH")
        return read_model_source(spec.path)
    digest = (f"its sha256 recorded there is {config.model_sha256[:SHOWN_DIGITS]}..." if config.model_sha256
              else "the checkpoint records no sha256 of it (written by an older edgetrain)")
    raise UntrustedModelError(
        f"{where} was compiled from the model file {recorded} ({digest}); rebuilding the program runs that "
        f"file's Python code, which edgetrain does only for a file named for this run: pass --model-file "
        f"{recorded} (it must be the same file: its sha256 is checked), or --trust-model-file if you trust "
        f"the checkpoint's source (in Python: Checkpoint.restore(model_file=PATH) or restore(trust=True))")


def _named_path(text, factory: str) -> Path:
    """The path of `--model-file PATH[:FACTORY]` (a FACTORY given must be the recorded one)."""
    text = str(text)
    head, sep, tail = text.rpartition(":")
    if sep and head.endswith(".py") and tail.isidentifier():
        if tail != factory:
            raise ModelLoadError(f"--model-file {text}: the checkpoint's program was built by {factory!r}, "
                                 f"not {tail!r}")
        text = head
    if not text.endswith(".py"):
        raise ModelLoadError(f"--model-file {text}: give the model's Python file (path/to/model.py)")
    return Path(text).expanduser().resolve()


def _first_difference(recorded: Optional[str], text: str) -> str:
    """' (first difference at line N: ...)' between the recorded text and `text`, or ''."""
    if recorded is None:
        return ""
    old, new = recorded.splitlines(), text.splitlines()
    for i, (a, b) in enumerate(zip(old, new), start=1):
        if a != b:
            return f" (first difference at line {i}: {b.strip()[:60]!r}, recorded {a.strip()[:60]!r})"
    n = min(len(old), len(new)) + 1
    return f" (first difference at line {n}: the file has {len(new)} lines, the recorded text {len(old)})"
