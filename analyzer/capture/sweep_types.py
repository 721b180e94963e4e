"""The sweep's choice of model types, and the default config it starts each one from.

**Which types.** A type of the causal-LM mapping is swept unless one of these holds, checked in
this order (:func:`classify_type`):

1. *encoder-decoder*: its config's default ``is_encoder_decoder`` is true, it is in a seq-to-seq
   mapping, or its causal-LM class takes the ``decoder_config`` of a composite config (the decoder
   half of an encoder-decoder model);
2. *encoder-only*: it is also in ``MODEL_FOR_MASKED_LM_MAPPING_NAMES`` (a bidirectional encoder
   whose causal-LM class is the encoder run with ``is_decoder=True``);
3. *multimodal-only*: its causal-LM class is a ``*ForConditionalGeneration`` (a model of image or
   audio and text; its text decoder is a type of its own in the mapping);
4. *alias*: its causal-LM class's config class belongs to another type of the mapping (``gpt-sw3``
   is ``gpt2`` with its own tokenizer, ``qwen3_5`` the text model ``qwen3_5_text`` ...): swept once,
   under that type.

:func:`text_config_key` and :func:`default_config` give the defaults a swept type is built from:
its config class's, or those of the text sub-config its causal-LM class takes. :func:`quiet` keeps
transformers' log and warnings down while configs and meta-device models are built. Imports
transformers (and torch through it) only when called.
"""

from __future__ import annotations

import contextlib
from typing import Any


def classify_type(model_type: str) -> tuple[str, str]:
    """``("sweep", "")``, ``("alias", other type)`` or ``("excluded", why)`` for one type of the mapping."""
    import transformers
    from transformers.models.auto import configuration_auto, modeling_auto

    causal = modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    seq2seq = set(modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES) | set(
        modeling_auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES
    )
    cls_name = causal[model_type]
    cls = getattr(transformers, cls_name, None)
    config_cls = configuration_auto.CONFIG_MAPPING[model_type]
    default_ed = getattr(config_cls, "is_encoder_decoder", False)
    with contextlib.suppress(Exception):
        default_ed = config_cls().is_encoder_decoder
    if default_ed or model_type in seq2seq:
        return "excluded", "encoder-decoder"
    own = getattr(cls, "config_class", None) if cls is not None else None
    if own is not None and getattr(own, "base_config_key", "") == "decoder_config":
        return "excluded", "encoder-decoder (the decoder half of a composite config)"
    if model_type in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "excluded", "encoder-only (also a masked LM: a bidirectional encoder run as a decoder)"
    if cls_name.endswith("ForConditionalGeneration"):
        return "excluded", f"multimodal-only ({cls_name})"
    if own is not None and own.model_type != model_type and own.model_type in causal:
        return "alias", own.model_type
    return "sweep", ""


def model_types() -> list[str]:
    from transformers.models.auto import modeling_auto

    return sorted(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def text_config_key(model_type: str) -> str | None:
    """The sub-config the causal-LM class takes when the type's config is composite (``text_config``)."""
    import transformers
    from transformers.models.auto import configuration_auto, modeling_auto

    cls = getattr(transformers, modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type], None)
    own = getattr(cls, "config_class", None)
    if own is None or own is configuration_auto.CONFIG_MAPPING[model_type]:
        return None
    return getattr(own, "base_config_key", None) or None


def default_config(model_type: str, sub: str | None) -> dict[str, Any]:
    """The defaults of the type's (text) config as a plain dict."""
    from transformers.models.auto import configuration_auto

    cfg = configuration_auto.CONFIG_MAPPING[model_type]()
    if sub:
        cfg = getattr(cfg, sub)
    return cfg.to_dict()


@contextlib.contextmanager
def quiet() -> Any:
    """Silence transformers' log (below errors) and Python warnings inside the block."""
    import logging
    import warnings

    log = logging.getLogger("transformers")
    old = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(old)
