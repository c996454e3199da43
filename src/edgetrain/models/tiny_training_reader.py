"""Reading a tiny-training model file (the paper's int8 models) without trusting it.

The file is a torch.save zip archive whose `data.pkl` holds dicts, lists, numbers and numpy
arrays (format: shared/assets/README.md). A pickle can run code and a zip member can inflate
to any size, so the file is read with bounds that hold before anything is allocated:

- the zip member's declared size is checked against MAX_MEMBER_BYTES before it is read, and
  the member is inflated no further than that declared size, whatever its stream holds (a
  611 KB archive once inflated a 600 MB member: 1.4 GB of memory);
- the pickle is read with safepickle.loads: numpy arrays and plain values only, every length
  and memo index it declares checked against the data before the unpickler allocates it;
- anything else that goes wrong (a truncated or bit-flipped archive, garbage, a pickle of the
  wrong things) is a ModelFileError naming the file, never another exception type."""
from __future__ import annotations

import zipfile
from pathlib import Path

from ..safepickle import Refused, loads

#: the largest data.pkl of the paper's three models is 1,023,991 bytes (mcunet-5fps; the others
#: 617 KB and 715 KB): an MCU model's int8 weights fit a flash of a few MB. 32 MiB is 32 times
#: that, and bounds what one file can make the loader allocate (a few times this)
MAX_MEMBER_BYTES = 32 << 20
#: the member of the archive that holds the model
DATA_MEMBER = "data.pkl"


class ModelFileError(ValueError):
    """A model file is missing, not a tiny-training model, corrupt, or larger than allowed."""


def read_member(path: Path) -> bytes:
    """The bytes of the archive's data.pkl, at most MAX_MEMBER_BYTES (checked before reading)."""
    with zipfile.ZipFile(path) as z:
        info = next((i for i in z.infolist() if i.filename.endswith(DATA_MEMBER)), None)
        if info is None:
            raise ModelFileError(f"{path} has no {DATA_MEMBER}: not a tiny-training model file")
        if info.file_size > MAX_MEMBER_BYTES:
            raise ModelFileError(f"{path}: its {info.filename} declares {info.file_size:,} bytes, more than a "
                                 f"tiny-training model file holds ({MAX_MEMBER_BYTES:,} at most): not read")
        with z.open(info) as f:  # inflates at most what is asked for; stops at the declared size (CRC checked)
            return f.read(info.file_size + 1)


def load_tiny_training(path) -> dict:
    """The raw dict of a tiny-training model file (format: shared/assets/README.md)."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"no model file at {path}; the paper's int8 models are in the assets' "
                             f"tiny-training/ folder (mbv2-w0.35.pkl, mcunet-5fps.pkl, proxyless-w0.3.pkl)")
    try:
        data = read_member(path)
        d = loads(data)
    except ModelFileError:
        raise
    except Refused as err:
        raise ModelFileError(f"{path}: refused to load: {err}") from None
    except Exception as err:  # a corrupt zip or pickle raises many types (BadZipFile, UnicodeDecodeError, ...)
        raise ModelFileError(f"cannot read {path}: corrupt or not a tiny-training model file "
                             f"({type(err).__name__}: {err})") from None
    if not isinstance(d, dict) or not {"first_conv", "blocks", "classifier"} <= set(d):
        what = f"keys {sorted(map(str, d))[:8]}" if isinstance(d, dict) else f"a {type(d).__name__}"
        raise ModelFileError(f"{path} is not a tiny-training model ({what})")
    return d
