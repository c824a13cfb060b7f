"""TrainConfig is the single source of the trainer's flags: defaults, choices, bounds, help."""

import dataclasses

import pytest
from absl import flags

from lowlevel import config as config_lib
from lowlevel.config import TrainConfig
from lowlevel.errors import UsageError

FLAGS = flags.FlagValues()  # not the global ones: other modules define --sync there too
config_lib.define_flags(FLAGS, "lowlevel.trainer")
FIELDS = dataclasses.fields(TrainConfig)


@pytest.mark.parametrize("field", FIELDS, ids=[f.name for f in FIELDS])
def test_every_field_is_a_flag_with_its_default_help_choices_and_bound(field):
    flag = FLAGS[field.name]
    default = field.default
    expected = [str(x) for x in default] if isinstance(default, tuple) else default
    assert flag.default == expected
    assert field.metadata["help"] in flag.help
    if "choices" in field.metadata:
        assert list(flag.parser.enum_values) == list(field.metadata["choices"])
    if "minimum" in field.metadata:
        assert flag.parser.lower_bound == field.metadata["minimum"]


def test_the_flags_parse_into_the_default_config():
    FLAGS.unparse_flags()
    FLAGS(["prog"])
    try:
        assert config_lib.from_flags(FLAGS, 2) == TrainConfig()
    finally:
        FLAGS.unparse_flags()


@pytest.mark.parametrize("kwargs,needle", [
    ({"save_checkpoint_secs": 0.0}, "--save_checkpoint_secs=0.0: expected a number > 0"),
    ({"learning_rate": -1.0}, "--learning_rate=-1.0: expected a number > 0"),
    ({"warmup_steps": -1}, "--warmup_steps=-1: expected 0 or more"),
    ({"communication_period": 0}, "--communication_period=0: expected a whole number > 0"),
])
def test_validate_checks_the_bounds_in_the_metadata(kwargs, needle):
    with pytest.raises(UsageError, match=needle.replace(".", r"\.")):
        TrainConfig(**kwargs).validate()
