"""--int8-headroom H: read and checked where it is typed, recorded in the program's configuration
(old checkpoints read as H = 1), and compiled into the int8 program."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from edgetrain.app.checkpoint import ProgramConfig, build_program
from edgetrain.app.cli import build_parser
from edgetrain.app.cli_config import config_from_options

from .conftest import INPUT


def _config(*argv):
    args = build_parser().parse_args(["compile", *map(str, argv), "-o", "out"])
    return config_from_options(args, args.model)


@pytest.mark.parametrize("argv,msg", [
    (["--quantize", "int8", "--int8-headroom", "0.5"], r"--int8-headroom: expected a number from 1 to 127"),
    (["--quantize", "int8", "--int8-headroom", "200"], r"--int8-headroom: expected a number from 1 to 127"),
    (["--quantize", "int8", "--int8-headroom", "nan"], r"--int8-headroom: expected a number from 1 to 127"),
    (["--quantize", "int8", "--int8-headroom", "wide"], r"--int8-headroom: expected a number from 1"),
    (["--int8-headroom", "4"], r"--int8-headroom applies to --quantize int8"),
])
def test_bad_headroom_is_a_usage_error(cli, model_file, tmp_path, argv, msg):
    code, _, err = cli("compile", f"{model_file}:build", "--input", INPUT, *argv, "-o", tmp_path / "out")
    assert code == 2, err
    assert re.search(msg, err), err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_headroom_is_recorded_and_compiled(model_file):
    config = _config(f"{model_file}:build", "--input", INPUT, "--quantize", "int8", "--update", "last:1",
                     "--int8-headroom", "4")
    assert config.int8_headroom == 4.0
    assert ProgramConfig.from_json(config.to_json()) == config
    old = json.loads(config.to_json())
    del old["int8_headroom"]  # a checkpoint written before the option
    assert ProgramConfig.from_json(json.dumps(old)).int8_headroom == 1.0
    wide = build_program(config).prog
    base = build_program(_config(f"{model_file}:build", "--input", INPUT, "--quantize", "int8", "--update",
                                 "last:1")).prog
    for name, layer in base.quant_layers.items():
        factor = 4.0 if name in wide.trainable else 1.0
        np.testing.assert_allclose(wide.quant_layers[name].w_scales, np.asarray(layer.w_scales) * factor, rtol=1e-6)
    assert set(wide.trainable) & set(wide.quant_layers) and set(wide.quant_layers) - set(wide.trainable)
