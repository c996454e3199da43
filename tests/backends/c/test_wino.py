"""The host library's Winograd path (runtime/et_float_wino.h): the forward, the input gradient and the weight
gradient of 3x3 stride-1 convolutions with enough channels and tiles, as F(4x4, 3x3) where they have enough
4x4 tiles, else F(2x2, 3x3). Its results agree with the reference on gradients and steps (every padding from
0 to 2, rectangular padding, odd sizes whose last tiles are cut, with and without a bias), it takes exactly
the convolutions it should, with the tile size it should (counted by the library), it is the same on one, two
and four threads, and its library-level switch (et_wino_tune) and build switches (ET_WINO=0, ET_WINO4=0) turn
it or F(4x4, 3x3) off."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.backends.c import blas
from edgetrain.backends.c.host import OPENMP_CFLAGS, to_c_program
from tests.backends.c.float_agreement import gradient_mismatches
from tests.backends.c.kinks import flipped_gradients
from tests.backends.c.test_blas import FAST, _agrees, _programs, checked_is_raw_and_refuses_overflow, fuse_every_update

pytestmark = pytest.mark.skipif(blas.library_blas() is None, reason="no BLAS installed (pip install scipy-openblas32)")

#: the threaded library's flags (at -O1, as FAST)
THREADED = tuple(f for f in OPENMP_CFLAGS if f != "-O3") + ("-O1",)
#: et_wino_tune's GEMM libraries: this CPU's choice, the BLAS, oneDNN's matmul
CHOSEN, BLAS, ONEDNN = 0, 1, 2
#: products in pieces of 8 rows (et_wino_piece_rows): Threes' 16 to 32 output channels in 2 to 4 pieces, the last
#: one shorter where 8 does not divide them (20 and 24 channels into pieces of 8 with batch 1's one block);
#: by default (pieces of at least 64 rows) its products are whole
PIECES = ("-DET_WINO_MIN_PIECE=8",)


class Threes(nn.Module):
    """3x3 stride-1 convolutions of 16 to 40 channels on 35x35 planes: "same" (padding 1), "valid" (0),
    padding 2 (wider), rectangular padding (2, 0), no bias; then ones the path must leave (3 input
    channels, stride 2, dilation 2, 5x5, 1x1 with padding, 8 output channels)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, 1, 1), nn.ReLU(),  # 3 input channels: not its forward (no input gradient)
            nn.Conv2d(16, 24, 3, 1, 1), nn.ReLU(),  # taken: forward and input gradient
            nn.Conv2d(24, 32, 3, 1, 0, bias=False), nn.ReLU(),  # taken: 33x33, the last tiles cut
            nn.Conv2d(32, 20, 3, 1, 2), nn.ReLU(),  # taken: 35x35
            nn.Conv2d(20, 16, 3, 1, (2, 0)),  # taken: 37x33
            nn.Conv2d(16, 16, 3, 2, 1), nn.ReLU(),  # stride 2: left
            nn.Conv2d(16, 16, 3, 1, 2, dilation=2), nn.ReLU(),  # dilated: left
            nn.Conv2d(16, 16, 5, 1, 2), nn.ReLU(),  # 5x5: left
            nn.Conv2d(16, 16, 1, 1, 1),  # 1x1 padded: left
            nn.Conv2d(16, 8, 3, 1, 1),  # 8 output channels: left (its input gradient has 16 outputs, 8 inputs)
            nn.Flatten(), nn.Linear(8 * 21 * 19, 7))

    def forward(self, x):
        return self.body(x)


#: the calls one gradients() or step() makes on the path: the forwards of the four taken convolutions, their
#: input gradients and their weight gradients
TAKEN = 4 + 4 + 4
#: F(4x4, 3x3) everywhere: at batch 1 the taken convolutions have 81 to 100 4x4 tiles, fewer than the forward's and
#: input gradient's ET_WINO4_MIN_TILES (128)
ALL4 = ("-DET_WINO4_MIN_TILES=1",)
#: F(4x4, 3x3)'s chunks one tile row each (9 tiles, under 16); by default up to 14 rows of 9 tiles, of two images
ROW_CHUNKS = ("-DET_WINO4_CHUNK=16",)


def taken4(batch: int, flags=()) -> int:
    """Of TAKEN, the calls as F(4x4, 3x3): all at batch 3 (243 to 300 4x4 tiles a convolution) or with ALL4; at
    batch 1, the weight gradients only (ET_WINO4_GW_MIN_TILES: 32); none with -DET_WINO4=0."""
    if "-DET_WINO4=0" in flags:
        return 0
    return TAKEN if batch == 3 or ALL4[0] in flags else 4


def _tuned(batch: int, flags, on: bool = True, gemm: int = CHOSEN):
    ref, c, x, y = _programs(batch, flags, Threes, 35)
    assert c.runner._lib.et_wino_tune(int(on), gemm) == 1
    c.runner._lib.et_wino_convolutions.restype = ctypes.c_long
    c.runner._lib.et_wino_convolutions4.restype = ctypes.c_long
    return ref, c, x, y


def needs_onednn(gemm: int):
    if gemm == ONEDNN and blas.dnnl() is None:
        pytest.skip("oneDNN not installed (pip install onednn-cpu-gomp onednn-devel-cpu-gomp)")


@pytest.mark.parametrize("batch, gemm, more", [(1, BLAS, ()), (3, BLAS, ()), (1, ONEDNN, ()), (3, ONEDNN, ()),
                                               (1, BLAS, PIECES), (1, ONEDNN, PIECES), (3, ONEDNN, PIECES),
                                               (1, ONEDNN, ALL4), (1, BLAS, ALL4 + PIECES), (3, ONEDNN, ROW_CHUNKS),
                                               (3, ONEDNN, ("-DET_WINO4=0",))])
def test_the_winograd_path_matches_the_reference(batch, gemm, more):
    needs_onednn(gemm)
    ref, c, x, y = _tuned(batch, FAST + more, gemm=gemm)
    _agrees(ref, c, x, y, steps=2)  # gradients(), then two steps: 3 forwards and input gradients each
    assert c.runner._lib.et_wino_convolutions() == 3 * TAKEN
    assert c.runner._lib.et_wino_convolutions4() == 3 * taken4(batch, more)
    assert c.runner._lib.et_wino_gemms() == gemm


def test_the_library_chooses_the_gemms_library():
    """oneDNN's matmul where the library has oneDNN, else the BLAS (chosen at the first convolution)."""
    _, c, x, y = _tuned(1, FAST)
    assert c.runner._lib.et_wino_gemms() == 0
    c.gradients(x, y)
    assert c.runner._lib.et_wino_gemms() == (ONEDNN if blas.DNNL_FLAG in FAST else BLAS)


def test_the_description_names_the_tile_sizes():
    """blas.describe (the text a compile prints) says which Winograd tiles the build's flags leave in."""
    assert blas.describe(FAST).endswith("3x3 stride-1 ones as Winograd F(4x4, 3x3) or F(2x2, 3x3)")
    assert blas.describe(FAST + ("-DET_WINO4=0",)).endswith("3x3 stride-1 ones as Winograd F(2x2, 3x3)")
    assert "Winograd" not in blas.describe(FAST + ("-DET_WINO=0",))


def test_it_takes_no_convolution_when_turned_off():
    ref, c, x, y = _tuned(3, FAST, on=False)
    _agrees(ref, c, x, y, steps=1)
    assert c.runner._lib.et_wino_convolutions() == 0


def test_the_build_switch_leaves_it_out():
    ref, c, x, y = _tuned(3, FAST + ("-DET_WINO=0",))
    c.gradients(x, y)
    assert c.runner._lib.et_wino_convolutions() == 0


def test_its_results_are_not_the_direct_convolutions():
    """The same program with the path always and never: close (the test above), but not the same bits,
    so the path did compute them (a count alone would not show that its result was used)."""
    runs = []
    for on in (True, False):
        _, c, x, y = _tuned(3, FAST, on=on)
        runs.append(c.gradients(x, y))
    assert any(not np.array_equal(np.asarray(runs[0][k]), np.asarray(runs[1][k])) for k in runs[0])


def test_f4x4_is_not_f2x2():
    """Batch 3 with F(4x4, 3x3) and with it left out of the build (-DET_WINO4=0): both on the path, both close to the
    reference (the test above), but every taken convolution's weight gradient differs in its bits (the last ones'
    from the forwards' outputs too), and so does the first convolution's (its output gradient is the second's input
    gradient)."""
    runs = []
    for more in ((), ("-DET_WINO4=0",)):
        _, c, x, y = _tuned(3, FAST + more)
        runs.append(c.gradients(x, y))
        assert c.runner._lib.et_wino_convolutions4() == taken4(3, more)
    for k in ("body.2.weight", "body.4.weight", "body.6.weight", "body.8.weight", "body.0.weight"):
        assert not np.array_equal(np.asarray(runs[0][k]), np.asarray(runs[1][k])), k


@pytest.mark.parametrize("batch, gemm, more", [(1, BLAS, ()), (3, BLAS, ()), (1, ONEDNN, ()), (3, ONEDNN, ()),
                                               (1, BLAS, PIECES), (3, ONEDNN, PIECES), (1, ONEDNN, ALL4 + PIECES),
                                               (3, ONEDNN, ROW_CHUNKS)])
def test_it_is_the_same_on_any_thread_count(batch, gemm, more):
    """On the threaded library the forward's and the input gradient's blocks of tiles run a block a thread
    where there are as many blocks as threads (batch 3: 3 or 4 blocks, on 2 threads), else their input
    transforms, all their calls of products at once on the threads, then their output transforms (batch 1's one
    block on 2 and 4 threads, batch 3's blocks on 4); the weight gradient's blocks one after another, each
    block's calls on the threads. Two steps on 1, 2 and 4 threads (more threads than this machine's cores
    still run the same calls) give the same losses and state, bit for bit, with whole products and in pieces,
    as F(2x2, 3x3) and as F(4x4, 3x3) (its chunks of tile rows on the threads)."""
    needs_onednn(gemm)
    runs = []
    for threads in (1, 2, 4):
        _, c, x, y = _tuned(batch, THREADED + more, gemm=gemm)
        c.runner.threads = threads
        losses = [c.step(x, y) for _ in range(2)]
        runs.append((losses, {k: np.array(v) for k, v in c.state.items()}))
        assert c.runner._lib.et_wino_convolutions() == 2 * TAKEN
        assert c.runner._lib.et_wino_convolutions4() == 2 * taken4(batch, more)
    for other in runs[1:]:
        assert runs[0][0] == other[0]
        for k, v in runs[0][1].items():
            assert np.array_equal(v, other[1][k]), k


@pytest.mark.parametrize("gemm", [BLAS, ONEDNN])
def test_the_fused_weight_gradient_and_update(monkeypatch, gemm):
    needs_onednn(gemm)
    fuse_every_update(monkeypatch)
    ref, c, x, y = _tuned(3, FAST, gemm=gemm)
    nodes = c.compiled.train_graph.nodes
    assert not [n for n in nodes if n.op == "conv2d_grad_weight" and n.attrs["groups"] == 1]
    _agrees(ref, c, x, y, steps=2)
    assert c.runner._lib.et_wino_convolutions() == 3 * TAKEN


def test_the_checked_step_is_the_raw_step(monkeypatch):
    """The fused update applies its rows through et_sgd_row, so the checked step (the step guard) applies
    them out of place: three checked steps leave the state bit for bit where three raw steps leave a copy,
    and a step whose update overflows under a finite loss says so and leaves the state as it was. (The
    overflowing row's weight, -3.3e38, also reaches the layers after it: the Winograd sums of such a weight
    cancel inexactly, so the first tensor named may be a later layer's.)"""
    fuse_every_update(monkeypatch)
    _, checked, x, y = _tuned(3, FAST)
    raw = checked.replace()  # its own library: on the path by default
    checked_is_raw_and_refuses_overflow(checked, raw, x, y, "body.2.weight",  # a taken convolution's (16 -> 24)
                                        "became non-finite; weights kept from step 3")
    assert checked.runner._lib.et_wino_convolutions() == 4 * TAKEN  # three steps and the refused one


#: every 3x3 stride-1 convolution of 16 channels or more on the path as F(4x4, 3x3), however few its tiles
#: and multiply-adds
EVERY4 = ("-DET_WINO_MIN_MACS=0", "-DET_WINO_MIN_TILES=1") + ALL4 + ("-DET_WINO4_GW_MIN_TILES=1",)
#: torchvision's ResNet-18 has 13 such convolutions (layer1's four, and three in each later stage, whose
#: first convolution has stride 2); each one's forward, input gradient and weight gradient
RESNET18_TAKEN = 13 * 3


@pytest.mark.slow
@pytest.mark.parametrize("size, batch, more, taken, tol", [
    # 64x64 at batch 8, the default thresholds: layer1's four convolutions (16x16 planes, 128 4x4 tiles) all
    # three as F(4x4, 3x3); layer2's three (8x8 planes) their weight gradients so (32 4x4 tiles) and their
    # forwards and input gradients as F(2x2, 3x3) (128 2x2 tiles); layer3 and layer4 (32 and 8 2x2 tiles)
    # none. Measured: every gradient within 3.7e-6 of the float64 program (5.5e-6 with MKL as the BLAS;
    # docs/benchmarks.md, "F(4x4, 3x3) on a model nobody here wrote")
    (64, 8, (), (12 + 3, 6), 1e-5),
    # 32x32 at batch 2, every one of the 13 as F(4x4, 3x3), down to layer4's 1x1 planes (one tile, mostly
    # cut): its transforms' coefficients (up to 8, and sixths and twenty-fourths) round more than F(2x2, 3x3)'s.
    # Measured against the float64 program: 1.7e-5 (5.6e-6 with the path's GEMMs on the BLAS; with MKL as the BLAS
    # 9.2e-6, and 1.2e-5 of the float64 run with the GEMMs on it), against 1.2-2.3e-6 for F(2x2, 3x3) and the GEMMs
    (32, 2, EVERY4, (RESNET18_TAKEN, 0), 3e-5)])
def test_torchvision_resnet18(size, batch, more, taken, tol):
    """A model nobody here wrote, as its users build it (torchvision's resnet18, 10 classes, in eval mode:
    residual blocks, 1x1 stride-2 shortcuts, batch norm and ReLU after the convolutions) on the path with
    F(4x4, 3x3), F(2x2, 3x3) and the GEMMs in one program: its gradients agree with the reference's, and
    again after a step (the C program's state copied into the reference, so the weights' transforms are of
    the updated weights). Where a ReLU decision lies within float32 rounding of zero, the float64 reference
    with that kink flipped or not decides (float_agreement.py, kinks.py): after its step at 64x64 this
    program has had one, 3.9e-8 from zero, that the float32 reference took the other way (docs/benchmarks.md,
    "F(4x4, 3x3) on a model nobody here wrote")."""
    import tests.realmodels.conftest as rm  # the torchvision op schemas its import needs

    torch.manual_seed(0)
    model = rm.torchvision_model("resnet18").eval()
    x, y = torch.randn(batch, 3, size, size), np.arange(batch) % rm.NUM_CLASSES
    make = (lambda: et.compile(model, (x,), update=et.Full(), optimizer=et.SGD(lr=0.01, momentum=0.9)))
    ref, c = make(), to_c_program(make(), FAST + more)
    lib = c.runner._lib
    assert lib.et_wino_tune(1, CHOSEN) == 1
    lib.et_wino_convolutions.restype = lib.et_wino_convolutions4.restype = ctypes.c_long

    def agrees():
        got = c.gradients(x, y)
        bad = gradient_mismatches(got, ref.gradients(x, y), lambda: flipped_gradients(ref, x, y), tol)
        assert not bad, f"relative errors (vs float32, vs float64 reference) {bad}"

    agrees()
    four, two = taken
    assert (lib.et_wino_convolutions4(), lib.et_wino_convolutions()) == (four, four + two)
    c.step(x, y)
    for k, v in c.state.items():
        ref.state[k][...] = v
    agrees()
    assert lib.et_wino_convolutions4() == 3 * four  # gradients, step, gradients
