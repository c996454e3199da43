"""Where the shared reference assets (data, not code) live: `../shared/assets/` from the
working directory, or the `shared/assets/` folder beside the repository root."""
from __future__ import annotations

from pathlib import Path

from .mnist import DataError

ASSETS_SUBDIR = Path("shared") / "assets"
#: src/edgetrain/data/assets.py -> parents[3] is the repository root
REPO_ROOT_DEPTH = 3


def _candidate_dirs() -> tuple[Path, ...]:
    repo_root = Path(__file__).resolve().parents[REPO_ROOT_DEPTH]
    return (Path.cwd().parent / ASSETS_SUBDIR, repo_root.parent / ASSETS_SUBDIR)


def default_assets_dir() -> Path | None:
    """The first existing shared assets folder, or None."""
    return next((d for d in _candidate_dirs() if d.is_dir()), None)


def require_assets(name: str) -> Path:
    """Path of the asset file `name`; DataError naming the expected locations if absent."""
    folder = default_assets_dir()
    if folder is not None and (folder / name).is_file():
        return folder / name
    looked = " or ".join(str(d / name) for d in _candidate_dirs())
    raise DataError(f"asset {name!r} not found: expected {looked}; put the shared assets "
                    f"folder at ../shared/assets/ relative to the working directory")
