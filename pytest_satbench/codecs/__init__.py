"""Reconstruction arms: `--recon SPEC` parsing and the codecs behind it."""

from pytest_satbench.codecs.base import (
    ArmSpec,
    Codec,
    CodecFactory,
    SpecError,
    build_codecs,
    normalise_spec,
    register_codec,
)

__all__ = ["ArmSpec", "Codec", "CodecFactory", "SpecError", "build_codecs", "normalise_spec", "register_codec"]
