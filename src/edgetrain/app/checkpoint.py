"""Checkpoints of a training program: everything needed to rebuild it and go on exactly.

A checkpoint is one safetensors file (`.ckpt`) holding
- `config`: how the program was compiled (ProgramConfig: model spec, inputs, loss, update
  scheme as resolved, quantization, optimizer, budget, backend) and, for a model file, the
  sha256 of its text; `model_source`: that text (rebuilding the program runs the file only
  when the user names it or trusts the checkpoint: modeltrust.py);
- `model/<key>`: the model's weights as the factory built them (so a factory that initialises
  at random, or a model file edited since, cannot change the program under a resume: the
  weights are loaded back and must fit the model);
- `calib/<i>`: for int8, the batches its scales were calibrated on;
- `state/<name>`: the program's state (trained and frozen weights, momentum), and its step
  count (the int8 updates' stochastic rounding is keyed by it);
- `train`: where training stands (epochs done, position in the epoch, data-order seed, the
  data's fingerprint, loss sums), plus a sha256 of all tensors.

`save_checkpoint` writes atomically (a temporary file in the same folder, fsync, rename,
fsync of the folder): a crash at any moment leaves the previous file or the new one, whole.
`load_checkpoint` refuses truncated or corrupt files with a CheckpointError."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from contextlib import suppress
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

FORMAT = "edgetrain-checkpoint"
VERSION = 1
SUFFIX = ".ckpt"
#: prefix of the temporary files save_checkpoint writes before renaming (so a crash's
#: leftovers are recognisable and never mistaken for a checkpoint)
TMP_PREFIX = ".tmp-"


class CheckpointError(ValueError):
    """A checkpoint is missing, truncated, corrupt, or does not fit the model it names."""


@dataclass(frozen=True)
class ProgramConfig:
    """What `edgetrain compile` was asked for, enough to compile the same program again."""

    model: str  # path/to/model.py:factory (absolute) or a zoo name
    inputs: tuple[str, ...]  # InputSpec texts, e.g. ("1x3x32x32",)
    model_args: dict = field(default_factory=dict)
    classes: Optional[int] = None  # zoo: num_classes; a file: passed as num_classes= when set
    loss: str = "cross_entropy"
    ignore_index: int = -100  # the class losses' ignored label (torch's ignore_index)
    update: Any = "full"  # "full" | "bias" | "last:K" | {"bias_last": n, "weights": {layer: ratio}}
    quantize: Optional[str] = None
    int8_headroom: float = 1.0  # int8: the trained layers' scales this many times wider
    backward: str = "float"  # int8: "integer" computes the backward and the updates in integers only
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    qas: bool = True
    seed: int = 0  # the optimizer's rounding seed
    sram: Optional[int] = None
    flash: Optional[int] = None
    backend: str = "reference"
    model_sha256: Optional[str] = None  # a model file: the sha256 of the text compiled (None: a zoo model)

    def to_json(self) -> str:
        d = asdict(self)
        d["inputs"] = list(self.inputs)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ProgramConfig":
        d = json.loads(text)
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise CheckpointError(f"the checkpoint's configuration has unknown fields {sorted(unknown)} "
                                  f"(written by a newer edgetrain?)")
        d["inputs"] = tuple(d["inputs"])
        return cls(**d)


# --- update schemes as text --------------------------------------------------------------------
def scheme_to_json(scheme) -> Any:
    from ..sparse import BiasOnly, Full, LastK, Sparse

    if isinstance(scheme, Full):
        return "full"
    if isinstance(scheme, BiasOnly):
        return "bias"
    if isinstance(scheme, LastK):
        return f"last:{scheme.k}"
    if isinstance(scheme, Sparse):
        return {"bias_last": scheme.bias_last, "weights": {str(k): v for k, v in sorted(scheme.weights.items())}}
    raise CheckpointError(f"cannot record update scheme {scheme!r}")


def scheme_from_json(value):
    from ..sparse import BiasOnly, Full, LastK, Sparse

    if isinstance(value, dict):
        return Sparse(bias_last=int(value["bias_last"]), weights={int(k): float(v) for k, v in value["weights"].items()})
    if value == "full":
        return Full()
    if value == "bias":
        return BiasOnly()
    if isinstance(value, str) and value.startswith("last:"):
        return LastK(int(value[5:]))
    raise CheckpointError(f"unknown update scheme {value!r} in the checkpoint")


# --- building a program ------------------------------------------------------------------------
@dataclass
class Built:
    """A compiled program and what a checkpoint of it needs besides its state."""

    prog: Any
    config: ProgramConfig  # with update resolved (update="auto" becomes the chosen Sparse scheme)
    model_state: dict[str, np.ndarray]
    calibration: Optional[list[np.ndarray]]
    model: Any = None
    model_source: Optional[str] = None  # a model file's text, as compiled


def build_program(config: ProgramConfig, model_state: Optional[dict] = None, calibration=None,
                  contributions=None, search: str = "exact", source=None, threads: Optional[int] = None) -> Built:
    """Compile `config` (update "auto" needs `contributions`). With `model_state` the model's
    weights are replaced by it first (CheckpointError if it does not fit the model). A model
    file is read once (or `source`, a usermodel.ModelSource the caller checked, is used): the
    text that runs is the text whose sha256 the config records. `threads`: the C backend's
    (et.compile's threads=; not part of the config: results do not depend on it)."""
    import torch

    import edgetrain as et

    from .usermodel import check_forward, example_inputs, load_model, parse_input, parse_model_spec, read_model_source

    specs = [parse_input(s) for s in config.inputs]
    spec = parse_model_spec(config.model)
    if spec.is_file:
        source = source if source is not None else read_model_source(spec.path)
        config = replace(config, model_sha256=source.sha256)
    else:
        source = None
    model = load_model(spec, config.model_args, config.classes, source=source)
    if model_state is not None:
        try:
            model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in model_state.items()})
        except RuntimeError as err:
            raise CheckpointError(f"the checkpoint's weights do not fit {config.model} any more (was the model "
                                  f"file changed?): {str(err).splitlines()[0]}") from None
    xs = example_inputs(specs)
    check_forward(model, xs, config.model, config.loss)
    if model_state is None:
        model_state = {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}
    update = "auto" if config.update == "auto" else scheme_from_json(config.update)
    budget = et.Budget(sram=config.sram, flash=config.flash) if (config.sram or config.flash) else None
    if config.quantize == "int8" and calibration is None:
        calibration = [x.numpy().copy() for x in xs]
    calib = None
    if calibration is not None:
        calib = [tuple(b) if isinstance(b, (tuple, list)) else (b,) for b in calibration]
    opt = et.SGD(lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay, qas=config.qas,
                 seed=config.seed)
    prog = et.compile(model, xs, loss=config.loss, ignore_index=config.ignore_index, update=update, quantize=config.quantize, optimizer=opt,
                      budget=budget, backend=config.backend, calibration=calib, int8_headroom=config.int8_headroom,
                      backward=config.backward, threads=threads,
                      **({"contributions": contributions, "search": search} if update == "auto" else {}))
    resolved = replace(config, update=scheme_to_json(prog.scheme))
    flat = None
    if calib is not None:
        if any(len(b) != 1 for b in calib):
            raise CheckpointError("calibration of models with several inputs cannot be recorded")
        flat = [np.ascontiguousarray(b[0]) for b in calib]
    return Built(prog, resolved, model_state, flat, model, source.text if source is not None else None)


# --- files ---------------------------------------------------------------------------------------
@dataclass
class Checkpoint:
    config: ProgramConfig
    model_state: dict[str, np.ndarray]
    calibration: Optional[list[np.ndarray]]
    state: dict[str, np.ndarray]
    steps: int = 0
    train: dict = field(default_factory=dict)  # epoch, position, seed, data, loss_sum, loss_count, ...
    path: Optional[Path] = None
    model_source: Optional[str] = None  # the model file's text (None: a zoo model, or an old checkpoint)

    @classmethod
    def of(cls, built: Built, train: Optional[dict] = None) -> "Checkpoint":
        prog = built.prog
        return cls(built.config, built.model_state, built.calibration,
                   {k: np.array(v, copy=True) for k, v in prog.state.items()}, int(prog.steps), dict(train or {}),
                   model_source=built.model_source)

    def restore(self, model_file=None, trust: bool = False, threads: Optional[int] = None) -> Built:
        """The program compiled from the config with this checkpoint's state and step count
        (`threads`: build_program's).
        A program compiled from a model file runs that file only when the caller names it
        (`model_file`, whose sha256 must match the recorded one) or trusts the checkpoint
        (`trust`); otherwise modeltrust.UntrustedModelError, before anything runs."""
        from .modeltrust import trusted_source

        source = trusted_source(self, model_file, trust)
        config = self.config
        if source is not None:  # the file named for this run (it may have moved since)
            config = replace(config, model=f"{source.path}:{config.model.rpartition(':')[2]}")
        built = build_program(config, self.model_state, self.calibration, source=source, threads=threads)
        prog = built.prog
        have, want = set(prog.state), set(self.state)
        if have != want:
            raise CheckpointError(f"the checkpoint's program state does not match the compiled program "
                                  f"(only in the checkpoint: {sorted(want - have)[:3]}, only in the program: "
                                  f"{sorted(have - want)[:3]})")
        for k, v in self.state.items():
            cur = np.asarray(prog.state[k])
            if cur.shape != v.shape or cur.dtype != v.dtype:
                raise CheckpointError(f"state {k!r}: the checkpoint holds {v.dtype}{v.shape}, the program "
                                      f"{cur.dtype}{cur.shape}")
        prog.load_state({k: v.copy() for k, v in self.state.items()}, steps=self.steps)
        return built


def _digest(tensors: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(tensors):
        a = np.asarray(tensors[k], order="C")
        h.update(f"{k}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def to_bytes(ck: Checkpoint) -> bytes:
    from safetensors.numpy import save

    tensors = {}
    for prefix, d in (("model/", ck.model_state), ("state/", ck.state)):
        for k, v in d.items():
            tensors[prefix + k] = np.asarray(v, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
    for i, b in enumerate(ck.calibration or ()):
        tensors[f"calib/{i}"] = np.asarray(b, order="C")
    meta = {"format": FORMAT, "version": str(VERSION), "config": ck.config.to_json(), "steps": str(ck.steps),
            "train": json.dumps(ck.train, sort_keys=True), "calibration": str(len(ck.calibration or ())),
            "sha256": _digest(tensors)}
    if ck.model_source is not None:
        meta["model_source"] = ck.model_source
    return save(tensors, metadata=meta)


def from_bytes(data: bytes, what: str = "checkpoint") -> Checkpoint:
    from safetensors import safe_open  # noqa: F401  (the package must be there)
    from safetensors.numpy import load

    try:
        tensors = load(data)
        meta = _metadata(data)
    except Exception as err:  # safetensors raises its own error types on any malformed header
        raise CheckpointError(f"{what} is not a complete checkpoint (truncated or corrupt): "
                              f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{what} is a safetensors file but not an edgetrain checkpoint "
                              f"(write one with `edgetrain compile -o DIR` or `edgetrain train`)")
    if meta.get("version") != str(VERSION):
        raise CheckpointError(f"{what} has checkpoint version {meta.get('version')}, this edgetrain reads {VERSION}")
    if meta.get("sha256") != _digest(tensors):
        raise CheckpointError(f"{what} is corrupt: its tensors do not match their recorded sha256")
    try:
        config = ProgramConfig.from_json(meta["config"])
        model_source = _model_source(meta, config, what)
        n_calib = int(meta.get("calibration", "0"))
        return Checkpoint(config=config,
                          model_state={k[6:]: v for k, v in tensors.items() if k.startswith("model/")},
                          calibration=[tensors[f"calib/{i}"] for i in range(n_calib)] if n_calib else None,
                          state={k[6:]: v for k, v in tensors.items() if k.startswith("state/")},
                          steps=int(meta["steps"]), train=json.loads(meta["train"]), model_source=model_source)
    except CheckpointError:
        raise
    except (KeyError, ValueError, TypeError) as err:
        raise CheckpointError(f"{what} has a malformed header: {type(err).__name__}: {err}") from None


def _model_source(meta: dict, config: ProgramConfig, what: str) -> Optional[str]:
    """The recorded model file text, checked against the config's sha256 (the header is not
    covered by the tensors' digest)."""
    from .usermodel import source_digest

    text = meta.get("model_source")
    if text is None:
        return None
    if config.model_sha256 is None or source_digest(text) != config.model_sha256:
        raise CheckpointError(f"{what} is corrupt: its model file text does not match its recorded sha256")
    return text


def _metadata(data: bytes) -> dict:
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    return header.get("__metadata__", {})


def atomic_write(path, data: bytes, pause: Optional[Callable[[Path], None]] = None) -> Path:
    """Write `data` to `path` so that a crash at any moment leaves either the old file or the
    new one, complete: a temporary file in the same folder, flushed and fsynced, then renamed
    over `path`, then the folder fsynced. `pause(tmp)` (tests) runs between the temporary
    file's fsync and the rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}.{os.getpid()}.", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; a saved file gets the usual mode
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if pause is not None:
            pause(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise
    with suppress(OSError):  # make the rename itself durable (not possible on every file system)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save_checkpoint(path, ck: Checkpoint, pause: Optional[Callable[[Path], None]] = None) -> Path:
    return atomic_write(path, to_bytes(ck), pause)


def load_checkpoint(path) -> Checkpoint:
    path = Path(path)
    if path.is_dir():
        found = latest_checkpoint(path)
        if found is None:
            raise CheckpointError(f"{path} holds no complete checkpoint (*{SUFFIX})")
        return found
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    except OSError as err:
        raise CheckpointError(f"cannot read checkpoint {path}: {err.strerror or err}") from None
    ck = from_bytes(data, f"checkpoint {path}")
    ck.path = path
    return ck


def latest_checkpoint(folder) -> Optional[Checkpoint]:
    """The complete checkpoint in `folder` furthest along (most steps; then the latest epoch
    file), skipping temporary and unreadable files."""
    best = None
    for p in sorted(Path(folder).glob("*" + SUFFIX)):
        if p.name.startswith(TMP_PREFIX):
            continue
        try:
            ck = load_checkpoint(p)
        except CheckpointError:
            continue
        key = (ck.steps, ck.train.get("epoch", 0), ck.train.get("position", 0))
        if best is None or key > best[0]:
            best = (key, ck)
    return best[1] if best else None


def remove_stale_temporaries(folder) -> list[Path]:
    """Delete the temporary files that killed saves left in `folder`; returns them. A
    temporary file's name carries its writer's pid: a live process's (another run's save in
    flight) is left alone."""
    gone = []
    for p in Path(folder).glob(TMP_PREFIX + "*"):
        if _writer_alive(p.name) or not p.is_file():
            continue
        with suppress(OSError):
            p.unlink()
            gone.append(p)
    return gone


def _writer_alive(name: str) -> bool:
    """Whether the process that writes temporary file `name` (`.tmp-<file>.<pid>.<random>`)
    is another live process (a name without a pid: an older edgetrain's, taken as dead)."""
    parts = name.rsplit(".", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    if pid == os.getpid() or pid <= 0:
        return False  # this process has no save in flight while it starts a run
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists, under another user
    return True
