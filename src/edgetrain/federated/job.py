"""What a federated run is (FederatedJob, a small frozen value) and what each process builds from it.

Every simulated device and the server run the same compiled program: the job says how to
build it (model, scheme, quantization, optimizer, calibration images), and building it is
deterministic, so a Ray worker that builds it from the job gets the program the server has,
with the same fixed int8 scales. Only the job travels with each Flower message; each process
builds its Setup once (`setup_of`, cached per job) and reuses it for every client it runs.

Models: the paper's int8 models (mbv2-w0.35, mcunet-5fps, proxyless-w0.3: ImageNet-pretrained,
from the shared assets, a new classifier; 128x128 input, pixels 0..255; default scheme the
paper's 49 KB one of tiny-training/schemes.json), "digitnet" (MNIST-pretrained, shipped with
the package; MNIST normalisation), any other zoo name (random weights), or a model of one's own
given as `model_factory` (a picklable callable that builds it, with `input_shape`: the command
line's path/to/model.py:FACTORY, whose text is read once and is what every process runs).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from .partition import parse_partition, partition

PAPER_MODELS = ("mbv2-w0.35", "mcunet-5fps", "proxyless-w0.3")
DIGITNET = "digitnet"
#: the paper's input resolution for its MCU models; their input is pixels 0..255
PAPER_RESOLUTION = 128
PIXELS_0_255 = ((0.0,), (1.0 / 255.0,))
#: MNIST's pixel mean and std (what DigitNet was trained on)
MNIST_NORM = ((0.1307,), (0.3081,))
SCHEMES_FILE = "tiny-training/schemes.json"
#: the paper's scheme a paper model trains by default (its smallest budget)
PAPER_SCHEME = "49kb"
#: what another model trains by default: its last two conv/linear layers (weights and biases)
OTHER_SCHEME = "last:2"
#: int8 scales are calibrated on this many training images (a fixed, seeded choice)
CALIBRATION_IMAGES = 32

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FederatedJob:
    """One federated fine-tuning run, as the CLI's options give it. `model` names a zoo model, or,
    with `model_factory` (a picklable callable returning the torch model, equal to itself once
    unpickled: each Ray worker builds the model with it), the model that factory builds (the
    name is shown only). `input_shape` is one example's (C, H, W) (default the zoo model's own;
    a factory's model needs it); `batch` examples make a step."""

    model: str
    data: str  # training images: a named set (mnist, cifar10[:PATH]) or an ImageFolder (data.folder.load_images)
    test_data: Optional[str] = None  # None: a named set's test split
    clients: int = 10
    rounds: int = 20
    partition: str = "iid"
    train_images: Optional[int] = None  # None: all
    test_images: Optional[int] = None
    local_steps: Optional[int] = None  # per client and round; None: `epochs` over its shard
    epochs: int = 1
    batch: int = 8
    lr: float = 0.01
    momentum: float = 0.0
    scheme: Optional[str] = None  # None: the model's default (paper models: "paper"; else OTHER_SCHEME)
    quantize: Optional[str] = "int8"
    qas: bool = True
    backend: str = "reference"
    seed: int = 0
    classes: int = 10
    assets: Optional[str] = None
    mean: Optional[tuple] = None  # None: the model's default normalisation
    std: Optional[tuple] = None
    input_shape: Optional[tuple] = None  # (C, H, W); None: the model's own
    model_factory: Optional[Callable[[], Any]] = field(default=None, repr=False)

    def __post_init__(self):
        if self.input_shape is not None:
            shape = tuple(self.input_shape)
            if len(shape) != 3 or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape):
                raise ValueError(f"input_shape must be one image's (C, H, W), got {self.input_shape!r}")
            object.__setattr__(self, "input_shape", shape)
        if self.model_factory is not None and self.input_shape is None:
            raise ValueError(f"{self.model}: give the model's input shape, e.g. --input 8x3x64x64 (batch first)")
        for name in ("clients", "rounds", "epochs", "batch", "classes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        for name in ("local_steps", "train_images", "test_images"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        parse_partition(self.partition)
        if self.backend not in ("reference", "c"):
            raise ValueError(f"backend must be 'reference' or 'c', got {self.backend!r}")
        if self.quantize not in (None, "int8"):
            raise ValueError(f"quantize must be None or 'int8', got {self.quantize!r}")


def parse_scheme(text: str, model: str, assets=None):
    """The update scheme of `--update` text: paper[:LABEL] (the paper's scheme for a paper
    model, default 49kb), full, bias, last:K, or a JSON object {"bias_last": N, "weights":
    {"layer": ratio}} (layers counted from the input, as the paper's)."""
    from ..sparse import BiasOnly, Full, LastK, Sparse

    t = str(text).strip()
    if t == "paper" or t.startswith("paper:"):
        if model not in PAPER_MODELS:
            raise ValueError(f"--update paper names the paper's schemes of {', '.join(PAPER_MODELS)}; {model} "
                             f"has none (use full, bias, last:K or a JSON scheme)")
        from ..data.assets import require_assets

        label = t.partition(":")[2] or PAPER_SCHEME
        table = json.loads(require_assets(SCHEMES_FILE, assets).read_text())["schemes"][model]
        if label not in table:
            raise ValueError(f"--update {t}: the paper's schemes of {model} are {', '.join(table)}")
        s = table[label]
        return Sparse(bias_last=int(s["bias_last"]), weights={int(k): float(v) for k, v in s["weights"].items() if v})
    if t == "full":
        return Full()
    if t == "bias":
        return BiasOnly()
    if t.startswith("last:") and t[5:].isdigit() and int(t[5:]) > 0:
        return LastK(int(t[5:]))
    if t.startswith("{"):
        try:
            d = json.loads(t)
            return Sparse(bias_last=int(d.get("bias_last", 0)),
                          weights={int(k): float(v) for k, v in d.get("weights", {}).items() if v})
        except (ValueError, TypeError, AttributeError) as err:
            raise ValueError(f"--update {t}: not a scheme object ({err})") from None
    raise ValueError(f"--update {t!r}: write paper[:LABEL], full, bias, last:K or a JSON object "
                     f"{{\"bias_last\": N, \"weights\": {{\"LAYER\": RATIO}}}}")


def build_model(job: FederatedJob):
    """(torch model in eval mode, input (C, H, W), (mean, std), default scheme text)."""
    from .. import models

    if job.model_factory is not None:
        net = job.model_factory()
        return net, job.input_shape, ((0.0,), (1.0,)), OTHER_SCHEME
    if job.model in PAPER_MODELS:
        from ..data.assets import require_assets

        path = require_assets(f"tiny-training/{job.model}.pkl", job.assets)
        net = models.from_tiny_training(path, num_classes=job.classes, seed=job.seed)
        return net, job.input_shape or (3, PAPER_RESOLUTION, PAPER_RESOLUTION), PIXELS_0_255, "paper"
    if job.model == DIGITNET:
        from ..models.digitnet import pretrained_digitnet

        if job.classes != 10:
            raise ValueError(f"digitnet has 10 classes (its pretrained classifier); got --classes {job.classes}")
        return pretrained_digitnet(), job.input_shape or (1, 28, 28), MNIST_NORM, OTHER_SCHEME
    net = models.get(job.model, num_classes=job.classes, seed=job.seed)
    shape = tuple(models.example_input(job.model).shape[1:])
    if len(shape) != 3:
        raise ValueError(f"{job.model} does not take images; federated fine-tuning here trains image classifiers")
    return net, job.input_shape or shape, ((0.0,), (1.0,)), OTHER_SCHEME


def output_classes(model, shape: tuple, what: str) -> int:
    """The classes `model` scores for one image of `shape` (its output's dim 1); ValueError when it
    does not take that image or gives no (batch, classes) logits."""
    import torch

    try:
        with torch.no_grad():
            out = model(torch.zeros((1,) + tuple(shape)))
    except Exception as err:
        first = (str(err).splitlines() or [""])[0]
        raise ValueError(f"{what} does not accept input {'x'.join(map(str, (1,) + tuple(shape)))}: "
                         f"{type(err).__name__}: {first}") from None
    if not isinstance(out, torch.Tensor) or out.dim() != 2:
        raise ValueError(f"{what} must return (batch, classes) logits for an image; it returned "
                         f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}")
    return int(out.shape[1])


@dataclass
class Setup:
    """What one process builds from a job: the program, the data and the clients' shards."""

    job: FederatedJob
    prog: Any  # edgetrain.Program
    train: Any  # data.folder.ImageSet
    shards: list  # per client: sorted indices into `train`
    shape: tuple  # (C, H, W)
    mean: tuple
    std: tuple
    _test: Any = field(default=None, repr=False)
    model: Any = field(default=None, repr=False)  # the torch model compiled (final weights load into it)

    def batch(self, index) -> np.ndarray:
        return self.train.batch(index, self.shape, self.mean, self.std)

    @property
    def test(self):
        """The test images (loaded on first use: only the server evaluates)."""
        if self._test is None:
            from ..data.folder import load_images

            j = self.job
            self._test = load_images(j.test_data or j.data, self.shape, split="test", limit=j.test_images,
                                     assets=j.assets)
        return self._test

    def local_steps(self, client: int) -> int:
        """Steps client `client` takes per round: the job's, or `epochs` passes over its shard."""
        j = self.job
        return j.local_steps or max(1, j.epochs * len(self.shards[client]) // j.batch)


def build_setup(job: FederatedJob) -> Setup:
    """Compile the job's program and split its data (deterministic: every process gets the same)."""
    import torch

    import edgetrain as et
    from ..data.folder import load_images

    model, shape, (mean, std), default_scheme = build_model(job)
    classes = output_classes(model, shape, job.model)
    mean, std = job.mean or mean, job.std or std
    scheme = parse_scheme(job.scheme or default_scheme, job.model, job.assets)
    train = load_images(job.data, shape, split="train", limit=job.train_images, assets=job.assets)
    if len(train) and int(train.labels.max()) >= classes:
        raise ValueError(f"{train.source} has labels up to {int(train.labels.max())}; the model outputs "
                         f"{classes} classes")
    shards = partition(job.partition, train.labels, job.clients, job.seed)
    calib = None
    if job.quantize == "int8":
        idx = np.sort(np.random.default_rng([job.seed, 0xCA1]).permutation(len(train))[:CALIBRATION_IMAGES])
        calib = [train.batch(idx, shape, mean, std)]
    opt = et.SGD(lr=job.lr, momentum=job.momentum, qas=job.qas, seed=job.seed)
    log.debug("compiling %s for a batch of %d x %s (%s, %s backend)", job.model, job.batch,
              "x".join(map(str, shape)), job.quantize or "float32", job.backend)
    prog = et.compile(model, (torch.zeros((job.batch,) + tuple(shape)),), loss="cross_entropy", update=scheme,
                      quantize=job.quantize, optimizer=opt, calibration=calib, backend=job.backend)
    return Setup(job, prog, train, shards, tuple(shape), tuple(mean), tuple(std), model=model)


#: per process: the setups built so far (a Ray worker runs many clients of one job)
_SETUPS: dict = {}


def setup_of(job: FederatedJob) -> Setup:
    """The Setup of `job`, built on first use in this process."""
    s = _SETUPS.get(job)
    if s is None:
        _SETUPS.clear()  # one job at a time: a finished job's program and data are let go
        s = _SETUPS[job] = build_setup(job)
    return s
