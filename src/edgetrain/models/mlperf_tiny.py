"""MLPerf Tiny's keyword-spotting DS-CNN and anomaly-detection autoencoder (the reference
models of github.com/mlcommons/tiny, benchmark/training/{keyword_spotting,anomaly_detection}).

- "ds-cnn" (`DSCNN`): 49 frames x 10 MFCC coefficients, (B, 1, 49, 10) -> 12 keywords.
  Conv 64 10x4 stride 2 + BN + ReLU (+ dropout 0.2), four depthwise-separable blocks
  (depthwise 3x3 + BN + ReLU, pointwise 64 + BN + ReLU), dropout 0.4, average pool, dense.
  The reference is Keras with padding="same": for the first convolution that is 4 rows above
  and 5 below, 1 column each side (TensorFlow puts the odd padding row last), giving 25x5;
  its average pool is (49 // 2, 10 // 2) = 24x5 with stride 24x5, so it averages the first 24
  of the 25 rows, as here.
- "ad-autoencoder" (`AnomalyAutoencoder`): 640 inputs (5 frames x 128 log-mel bins) ->
  128 x4 -> 8 -> 128 x4 -> 640, every hidden dense followed by BN + ReLU, the output linear;
  trained with MSE against its input (loss="mse"). Its output size is the input's, so
  `num_classes` is not used.

Dropout is the identity in eval mode, which is how the zoo builds models and how on-device
fine-tuning at batch 1 runs (DESIGN.md)."""
from __future__ import annotations

import torch
from torch import nn

from .norm_init import BN_MEAN_STD, BN_VAR_RANGE, NORM_SCALE_RANGE, NORM_SHIFT_STD

#: keyword spotting: 49 MFCC frames (1 s at a 20 ms stride) x 10 coefficients, 12 labels
KWS_FRAMES, KWS_MFCC, KWS_CLASSES = 49, 10, 12
DSCNN_FILTERS, DSCNN_BLOCKS = 64, 4
DSCNN_FIRST_KERNEL, DSCNN_FIRST_STRIDE = (10, 4), (2, 2)
#: Keras "same" padding of the first convolution on 49x10, (left, right, top, bottom):
#: rows (25 - 1) * 2 + 10 - 49 = 9 -> 4 above, 5 below; columns (5 - 1) * 2 + 4 - 10 = 2 -> 1 and 1
DSCNN_FIRST_PADDING = (1, 1, 4, 5)
#: the reference's pool: (input rows // 2, input columns // 2)
DSCNN_POOL = (KWS_FRAMES // 2, KWS_MFCC // 2)
DSCNN_DROPOUT_FIRST, DSCNN_DROPOUT_LAST = 0.2, 0.4
#: anomaly detection: 5 frames x 128 log-mel bins in, 128-wide hidden layers, an 8-wide code
AD_INPUTS, AD_HIDDEN, AD_CODE, AD_DEPTH = 640, 128, 8, 4


def _conv_bn_relu(conv: nn.Conv2d) -> list[nn.Module]:
    return [conv, nn.BatchNorm2d(conv.out_channels), nn.ReLU()]


class DSCNN(nn.Module):
    """MLPerf Tiny's keyword-spotting depthwise-separable CNN (input (B, 1, 49, 10))."""

    def __init__(self, num_classes: int = KWS_CLASSES, filters: int = DSCNN_FILTERS, blocks: int = DSCNN_BLOCKS):
        super().__init__()
        layers = [nn.ZeroPad2d(DSCNN_FIRST_PADDING),
                  *_conv_bn_relu(nn.Conv2d(1, filters, DSCNN_FIRST_KERNEL, stride=DSCNN_FIRST_STRIDE)),
                  nn.Dropout(DSCNN_DROPOUT_FIRST)]
        for _ in range(blocks):
            layers += _conv_bn_relu(nn.Conv2d(filters, filters, 3, padding=1, groups=filters))
            layers += _conv_bn_relu(nn.Conv2d(filters, filters, 1))
        layers += [nn.Dropout(DSCNN_DROPOUT_LAST), nn.AvgPool2d(DSCNN_POOL), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(filters, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def _dense_bn_relu(n_in: int, n_out: int) -> list[nn.Module]:
    return [nn.Linear(n_in, n_out), nn.BatchNorm1d(n_out), nn.ReLU()]


class AnomalyAutoencoder(nn.Module):
    """MLPerf Tiny's anomaly-detection dense autoencoder (input (B, 640), output (B, 640)).
    `num_classes` is accepted for the zoo's signature and not used."""

    def __init__(self, num_classes: int = AD_INPUTS, inputs: int = AD_INPUTS, hidden: int = AD_HIDDEN,
                 code: int = AD_CODE, depth: int = AD_DEPTH):
        super().__init__()
        widths = [inputs] + [hidden] * depth + [code] + [hidden] * depth
        layers = []
        for a, b in zip(widths, widths[1:]):
            layers += _dense_bn_relu(a, b)
        self.body = nn.Sequential(*layers)
        self.output = nn.Linear(hidden, inputs)
        _random_batch_norm_1d(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.body(x))


@torch.no_grad()
def _random_batch_norm_1d(model: nn.Module) -> None:
    """The zoo's random batch-norm affines and running statistics (models/__init__.py: eval-mode
    normalisation is then never the identity), for BatchNorm1d, which the zoo's `_init` leaves
    alone; from the global RNG, which `models.get` seeds."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm1d):
            nn.init.uniform_(m.weight, *NORM_SCALE_RANGE)
            nn.init.normal_(m.bias, 0.0, NORM_SHIFT_STD)
            nn.init.normal_(m.running_mean, 0.0, BN_MEAN_STD)
            nn.init.uniform_(m.running_var, *BN_VAR_RANGE)


#: zoo entries: name -> (factory(num_classes, **kw), one example's input shape)
ZOO = {
    "ds-cnn": (DSCNN, (1, KWS_FRAMES, KWS_MFCC)),
    "ad-autoencoder": (AnomalyAutoencoder, (AD_INPUTS,)),
}
