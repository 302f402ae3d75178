"""What every program does to its flags after parsing (`txl_io.program.check_flag_values`),
and the top level of a filesystem URL as a folder's parent."""

import os

import pytest
from absl import app, flags

from txl_io import files
from txl_io.program import check_flag_values


def flag_values(**values):
    holder = flags.FlagValues()
    for name, value in values.items():
        kind = flags.DEFINE_float if isinstance(value, float) else flags.DEFINE_string
        kind(name, None, "", flag_values=holder)
    holder(["program"] + [f"--{name}={value}" for name, value in values.items()])
    return holder


def test_a_path_flag_starting_with_a_tilde_is_expanded_and_other_strings_are_not(monkeypatch):
    monkeypatch.setenv("HOME", "/home/someone")
    holder = flag_values(model_dir="~/runs/x", vocab="~", prompt="~/not a path", text="a~b")
    check_flag_values(holder)
    assert holder.model_dir == "/home/someone/runs/x" and holder.vocab == os.path.expanduser("~")
    assert holder.prompt == "~/not a path" and holder.text == "a~b"


@pytest.mark.parametrize("value, fix", [("gs:bucket/run", "gs://bucket/run"), ("s3:/b/x", "s3://b/x"),
                                        ("ram:exp", "ram://exp")])
def test_a_url_missing_its_slashes_is_refused_with_the_fix(value, fix):
    with pytest.raises(app.UsageError, match=f"--model_dir={value} looks like a URL missing its '//': did you "
                                             f"mean {fix}"):
        check_flag_values(flag_values(model_dir=value))


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_every_non_finite_float_is_refused_naming_its_flag(value):
    with pytest.raises(app.UsageError, match=f"--learning_rate={float(value)} is not a finite number"):
        check_flag_values(flag_values(learning_rate=float(value)))
    check_flag_values(flag_values(learning_rate=1e-3))


def test_the_parent_of_a_url_top_level_is_its_root():
    assert files.dirname("ram://exp") == "ram://" and files.dirname("gs://b/run") == "gs://b"
    assert files.dirname("runs/x") == "runs"
