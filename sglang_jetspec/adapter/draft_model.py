"""JetSpec draft heads as SGLang model classes, registered in SGLang's ModelRegistry.

Published JetSpec heads declare `architectures: ["DFlashDraftModel"]` (DFlash2 heads
"DFlash2DraftModel") with `dflash_config.causal_head`. SGLang's own DFlash classes read causality
only from `is_causal` and default to bidirectional (ENCODER_ONLY) attention, which is wrong for a
causal JetSpec head. The JetSpec classes set `is_causal` from `causal_head` and otherwise reuse
SGLang's layers, so weights in the published layout load unchanged. The DFlash names stay SGLang's:
JETSPEC maps a head's architecture to its JetSpec class (`jetspec_architecture`) instead of
overriding them, so DFLASH servers are unaffected.

Importing this module imports SGLang's model code; only a scheduler process building JETSPEC does.
"""

from __future__ import annotations

from sglang.srt.models.dflash import DFlash2DraftModel, DFlashDraftModel


def apply_causal_head(config) -> None:
    """Carry dflash_config.causal_head over to the `is_causal` flag SGLang's DFlash layers read."""
    text = config.get_text_config()
    if getattr(text, "is_causal", None) is None:
        dflash = getattr(text, "dflash_config", None) or {}
        text.is_causal = bool(dflash.get("causal_head", False))


class JetSpecDraftModel(DFlashDraftModel):
    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        apply_causal_head(config)
        super().__init__(config=config, quant_config=quant_config, prefix=prefix)


class JetSpecDFlash2DraftModel(DFlash2DraftModel):
    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        apply_causal_head(config)
        super().__init__(config=config, quant_config=quant_config, prefix=prefix)


DRAFT_CLASSES = (JetSpecDraftModel, JetSpecDFlash2DraftModel)
_JETSPEC_FOR = {
    "DFlashDraftModel": JetSpecDraftModel.__name__,
    "DFlash2DraftModel": JetSpecDFlash2DraftModel.__name__,
    **{cls.__name__: cls.__name__ for cls in DRAFT_CLASSES},
}


def jetspec_architecture(architecture: str) -> str:
    """The registered JetSpec class name for a head's declared architecture."""
    try:
        return _JETSPEC_FOR[architecture]
    except KeyError:
        raise ValueError(
            f"draft head architecture {architecture!r} is not a JetSpec/DFlash head: "
            f"expected one of {sorted(_JETSPEC_FOR)} in config.json 'architectures'"
        ) from None


def register_draft_models() -> None:
    """Idempotent: add the JetSpec classes to SGLang's ModelRegistry."""
    from sglang.srt.models.registry import ModelRegistry

    for cls in DRAFT_CLASSES:
        ModelRegistry.models.setdefault(cls.__name__, cls)
