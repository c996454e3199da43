"""Where the shared reference assets (data and the paper's model files, not code) live.

One folder, chosen in this order and never relative to the working directory (whatever
`../shared/assets` happens to sit beside it is not read):

1. the folder given explicitly (the CLI's `--assets DIR`, or an `assets=` argument);
2. the environment variable EDGETRAIN_ASSETS;
3. in a source checkout only, `shared/assets` beside the repository root
   (`<repo>/../shared/assets`, where this project's CI and benches keep it).

An installed package (no checkout around it) has no default: it needs 1 or 2."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from .errors import DataError

ASSETS_ENV = "EDGETRAIN_ASSETS"
ASSETS_SUBDIR = Path("shared") / "assets"
#: src/edgetrain/data/assets.py -> parents[3] is the repository root of a source checkout
REPO_ROOT_DEPTH = 3
HOW_TO_SET = f"pass --assets DIR or set {ASSETS_ENV}=DIR"


def checkout_assets_dir(module_file=__file__) -> Optional[Path]:
    """`shared/assets` beside the repository root when this module (`module_file`) runs from a
    source checkout (src/edgetrain/... under a folder with pyproject.toml), else None."""
    here = Path(module_file).resolve()
    repo_root = here.parents[REPO_ROOT_DEPTH]
    if here.parents[REPO_ROOT_DEPTH - 1].name != "src" or not (repo_root / "pyproject.toml").is_file():
        return None
    return repo_root.parent / ASSETS_SUBDIR


def assets_setting(explicit=None) -> tuple[Optional[Path], str]:
    """(the assets folder that applies, where that choice came from), the folder None when
    nothing is set and this is no checkout. The folder need not exist."""
    if explicit is not None and str(explicit) != "":
        return Path(explicit), "--assets"
    env = os.environ.get(ASSETS_ENV, "")
    if env:
        return Path(env), ASSETS_ENV
    return checkout_assets_dir(), "the checkout's default"


def default_assets_dir(explicit=None) -> Optional[Path]:
    """The assets folder (explicit, else $EDGETRAIN_ASSETS, else the checkout's) if it exists,
    or None."""
    folder, _ = assets_setting(explicit)
    return folder if folder is not None and folder.is_dir() else None


def require_assets(name, explicit=None) -> Path:
    """Path of the asset file `name` (relative to the assets folder); DataError naming the one
    place looked at, and how to choose another, if it is absent."""
    folder, origin = assets_setting(explicit)
    if folder is None:
        raise DataError(f"asset {str(name)!r} needs the shared assets folder, and none is set: {HOW_TO_SET}")
    path = folder / name
    if path.is_file():
        return path
    where = f"{folder} (from {origin})" if folder.is_dir() else f"{folder} (from {origin}) does not exist"
    raise DataError(f"asset {str(name)!r} not found: looked for {path}; assets folder {where}; "
                    f"to use another folder, {HOW_TO_SET}")
