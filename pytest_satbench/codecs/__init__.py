"""Reconstruction arms: `--recon SPEC` parsing and the codecs behind it.

Codec implementations are not imported here: they are found through the entry-point group
`pytest_satbench.codecs` (see `base`), the first time a spec is normalised or built. Importing
the package (any of its modules) makes every table label an arm as its codec does
(`core.arms.use_labeller`)."""

from pytest_satbench.codecs.base import (
    ArmSpec,
    Codec,
    CodecFactory,
    SpecError,
    arm_label,
    budget_of,
    build_codecs,
    describe_arm,
    disk_cacheable,
    expand_shorthands,
    normalise_spec,
    parse_spec,
    register_codec,
)

__all__ = ["ArmSpec", "Codec", "CodecFactory", "SpecError", "arm_label", "budget_of", "build_codecs", "describe_arm",
           "disk_cacheable", "expand_shorthands", "normalise_spec", "parse_spec", "register_codec"]

from pytest_satbench.core.arms import use_labeller  # noqa: E402  (after the registry it names)

use_labeller(arm_label)
