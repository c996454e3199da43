"""The program's settings from the command line options, shared by `compile` (cli_compile.py)
and `train` (cli_program.py): the ProgramConfig, the images' normalization, the int8
calibration batch, and how both report progress."""
from __future__ import annotations

from typing import Optional

#: the checkpoint `compile` writes next to the project (a program before any training)
COMPILED_FILE = "program.ckpt"
#: --backend of every command that runs a program (train, compile, demo, federate): one rule,
#: backends/c/toolchain.default_backend (spelled out here: --help imports no numpy)
BACKEND_HELP = ("run the program on the numpy reference runtime or as the generated C built for this host "
                "(default c when a host C compiler is found: $CC, else cc, gcc or clang on PATH; else reference)")

#: --threads of train and demo (api.compile's threads=, backends/c/host.py)
THREADS_HELP = ("C backend: run the kernels' parallel loops and the BLAS on N threads, with the library built "
                "with OpenMP (default: the serial library, its BLAS on $EDGETRAIN_BLAS_THREADS threads, else 1); "
                "the losses and weights do not depend on N")


def threads_option(threads: Optional[int], backend: str) -> Optional[int]:
    """--threads for a program on `backend`: None when not given; a usage error (ValueError) off
    the C backend, where it would do nothing."""
    if threads is not None and backend != "c":
        raise ValueError(f"--threads applies to the C backend, not the {backend} one (--backend c)")
    return threads


def config_from_options(args, model_text: str):
    """The ProgramConfig (checkpoint.py) the program options of `args` describe, for the model
    `model_text` (a model file's FACTORY or a zoo name); usage errors as ValueError."""
    from .checkpoint import ProgramConfig
    from ..backends.c.toolchain import default_backend
    from ..config import parse_bytes
    from .usermodel import default_inputs, parse_input, parse_model_args, parse_model_spec

    spec = parse_model_spec(model_text)
    inputs = args.input or None
    if inputs is None:
        if spec.is_file:
            raise ValueError(f"{spec}: give the model's input shape, e.g. --input 1x3x64x64 (batch first)")
        inputs = default_inputs(spec.name)
    specs = [str(parse_input(s)) for s in inputs]
    if args.update_spec != "auto" and args.contributions:
        raise ValueError("--contributions is used only with --update auto")
    quantize = None if args.quantize in (None, "none") else args.quantize
    int8_headroom = _or_default(args.int8_headroom, 1.0)
    if int8_headroom != 1 and quantize != "int8":
        raise ValueError("--int8-headroom applies to --quantize int8")
    backward = _or_default(args.backward, "float")
    if backward != "float" and quantize != "int8":
        raise ValueError("--backward integer applies to --quantize int8")
    return ProgramConfig(model=str(spec), inputs=tuple(specs), model_args=parse_model_args(args.model_arg),
                         classes=args.classes, loss=args.loss or "cross_entropy",
                         ignore_index=_or_default(args.ignore_index, -100), update=args.update_spec or "full",
                         quantize=quantize, int8_headroom=int8_headroom, backward=backward,
                         lr=_or_default(args.lr, 0.01), momentum=_or_default(args.momentum, 0.0),
                         weight_decay=_or_default(args.weight_decay, 0.0), qas=not args.no_qas,
                         seed=_or_default(args.rounding_seed, 0), sram=parse_bytes(args.sram, "--sram"),
                         flash=parse_bytes(args.flash, "--flash"), backend=args.backend or default_backend())


def _or_default(v, default):
    return default if v is None else v


def normalization(args, channels: int, stored=None, fixed: Optional[str] = None) -> tuple[tuple, tuple]:
    """(mean, std): --mean/--std, else `stored`, else 0 and 1. With `fixed` (the reason, as
    a message) a value given that differs from the stored one is refused."""
    if fixed:
        for name, new, old in (("--mean", args.mean, stored[0]), ("--std", args.std, stored[1])):
            if new is not None and tuple(new) != tuple(old):
                raise ValueError(f"{name}: {fixed} {list(old)}")
    mean = args.mean if args.mean is not None else (stored[0] if stored else (0.0,))
    std = args.std if args.std is not None else (stored[1] if stored else (1.0,))
    for name, v in (("--mean", mean), ("--std", std)):
        if len(v) not in (1, channels):
            raise ValueError(f"{name} has {len(v)} values; the model's images have {channels} channel(s)")
    if any(s == 0 for s in std):
        raise ValueError("--std values must not be 0")
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)


def calibration_from(args, config, mean_std=None):
    """--calibrate DATA as one float batch (int8 only)."""
    if not args.calibrate:
        return None
    if config.quantize != "int8":
        raise ValueError("--calibrate applies to --quantize int8")
    from ..data.folder import check_image_shape, load_images
    from .usermodel import parse_input

    shape = check_image_shape(parse_input(config.inputs[0]).shape)
    mean, std = mean_std or normalization(args, shape[0])
    data = load_images(args.calibrate, shape, limit=args.calibrate_images or 32, skip_bad=True)
    batch = data.batch(list(range(len(data))), shape, mean, std)
    return [batch], data


def say(*a):
    """A progress line of the command: an INFO record of the "edgetrain" logger, which the command
    line writes to standard error at once (the user watches a long compile; -q silences it)."""
    import logging

    logging.getLogger(__name__).info(" ".join(map(str, a)))
