"""Offline data sets, read straight from installed packages or local files."""
from .assets import default_assets_dir, require_assets
from .cifar import CIFAR10_CLASSES, load_cifar10
from .fashion import FASHION_CLASSES, load_fashion_mnist
from .imagenet_samples import center_crop, load_cifar_samples, load_imagenet_samples, resize
from .mnist import DataError, load_mnist

__all__ = ["CIFAR10_CLASSES", "DataError", "FASHION_CLASSES", "center_crop", "default_assets_dir",
           "load_cifar10", "load_cifar_samples", "load_fashion_mnist", "load_imagenet_samples",
           "load_mnist", "require_assets", "resize"]
