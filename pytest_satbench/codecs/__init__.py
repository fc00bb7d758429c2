"""Reconstruction arms: `--recon SPEC` parsing and the codecs behind it.

Codec implementations are not imported here: they are found through the entry-point group
`pytest_satbench.codecs` (see `base`), the first time a spec is normalised or built."""

from pytest_satbench.codecs.base import (
    ArmSpec,
    Codec,
    CodecFactory,
    SpecError,
    build_codecs,
    normalise_spec,
    parse_spec,
    register_codec,
)

__all__ = ["ArmSpec", "Codec", "CodecFactory", "SpecError", "build_codecs", "normalise_spec", "parse_spec", "register_codec"]
