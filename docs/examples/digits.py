"""A small convolutional network for 28x28 grey digits: the model of docs/tutorial.md.

`build(num_classes=10)` is the factory the CLI calls: `edgetrain compile
docs/examples/digits.py:build --input 1x1x28x28 ...`."""
import torch
from torch import nn


class Digits(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.classifier = nn.Linear(32, num_classes)

    def forward(self, x):
        x = self.features(x)
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def build(num_classes: int = 10, weights: str = "") -> nn.Module:
    """The network, initialised from seed 0, or with the weights of a safetensors file (what
    `edgetrain export` writes): `--model-arg weights=digits.safetensors`."""
    torch.manual_seed(0)
    model = Digits(num_classes)
    if weights:
        from safetensors.torch import load_file

        model.load_state_dict(load_file(weights))
    return model.eval()  # eval: batch norm uses (and trains through) its running statistics
