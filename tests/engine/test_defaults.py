"""One source of defaults: an engine setting's default is written in `RuntimeConfig` only; the
option that sets it names the field (`Option.config`) and takes its default from there, and the
engine's constructors read theirs from there too (`config_default`)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

from pytest_satbench.engine.client import ServerPool
from pytest_satbench.engine.config import RuntimeConfig, config_default
from pytest_satbench.engine.images import ImagePipeline
from pytest_satbench.engine.transport import Connections
from pytest_satbench.plugin.options import OPTIONS, Settings

FIELDS = {f.name for f in dataclasses.fields(RuntimeConfig)}
OPTIONS_PY = Path(inspect.getfile(Settings))


def test_each_engine_option_names_its_field_and_takes_its_default_from_there() -> None:
    engine = [o for o in OPTIONS if o.config]
    assert len(engine) >= 15
    for opt in engine:
        assert opt.config in FIELDS, opt.flag
        assert getattr(Settings(), opt.settings_fields[0]) == config_default(opt.config), opt.flag
    # an option whose Settings field is an engine field names it: none is filled field by field,
    # except those the run builds from it (a tag is required; arms, caps, the order and the
    # shard's record, with its question counts, are built)
    built = {"tag", "arms", "concurrency", "order", "shard"}
    unnamed = [o.flag for o in OPTIONS if not o.config and len(o.settings_fields) == 1
               and o.settings_fields[0] in FIELDS and o.settings_fields[0] not in built]
    assert unnamed == []


def test_the_option_table_writes_no_engine_default() -> None:
    """In the table's source, an Option(config=...) call has no default= argument."""
    tree = ast.parse(OPTIONS_PY.read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "Option"]
    with_config = [c for c in calls if any(k.arg == "config" for k in c.keywords)]
    assert len(with_config) == len([o for o in OPTIONS if o.config])
    assert [ast.literal_eval(c.args[0]) for c in with_config if any(k.arg == "default" for k in c.keywords)] == []
    with pytest.raises(ValueError, match="RuntimeConfig.max_new"):
        type(OPTIONS[0])("--x", "y", default=5, config="max_new")


@pytest.mark.parametrize(("function", "parameter", "field"), [
    (ServerPool.__init__, "timeout", "request_timeout"),
    (ServerPool.__init__, "retries", "retries"),
    (ServerPool.__init__, "max_reply_bytes", "max_reply_bytes"),
    (ServerPool.__init__, "max_text_chars", "max_answer_chars"),
    (ImagePipeline.__init__, "cache_images", "cache_images"),
    (ImagePipeline.__init__, "cache_mb", "cache_mb"),
    (Connections.__init__, "max_body", "max_reply_bytes"),
])
def test_engine_constructors_take_their_defaults_from_the_config(function: object, parameter: str, field: str) -> None:
    assert inspect.signature(function).parameters[parameter].default == config_default(field)
