"""The model card: what a PIT model folder says about itself, so that an evaluation needs no hand-typed cutoff.

A PitTraining's merged model folder (``<run>/model/``, or where it was published) holds :data:`MODEL_CARD`, a
:class:`ModelCard`: the knowledge cutoff it was trained to, the digest of the corpus audit that admitted its
documents, the base model and the method. An evaluation of that folder (``trainingRef: {artifact: model}``,
or a ``uri`` pointing at it) inherits the cutoff when ``models[i].knowledgeCutoff`` is left out, and refuses a
hand-typed value that disagrees (:func:`resolve_cutoff`).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from pydantic import ValidationError

from pitlab.api.base import ISODate, SpecError, SpecModel

MODEL_CARD = "pitlab_model.json"
"""File name of the model card inside a model folder."""


class ModelCard(SpecModel):
    """A PIT model folder's card. ``knowledgeCutoff``: the last date a training document may carry (the
    PitTraining's ``spec.knowledgeCutoff``); ``corpusAuditSha256``: sha256 (hex) of the run's
    ``corpus_audit.json``; ``training``: the PitTraining's ``metadata.name``; ``baseModel``: its
    ``spec.baseModel.uri``; ``method``: ``full`` or ``lora``, or ``random-init`` on the ``base/`` folder of a
    ``randomInit`` training (random weights and a tokenizer trained on the documents up to the cutoff)."""

    knowledge_cutoff: ISODate
    corpus_audit_sha256: str | None = None
    training: str | None = None
    base_model: str | None = None
    method: str | None = None


def read_model_card(folder: Path | str) -> ModelCard | None:
    """The card of a local model folder, or None when it has none (a model not trained by pitlab). Raises
    :class:`pitlab.api.base.SpecError` naming the file when the card exists but does not parse."""
    path = Path(folder) / MODEL_CARD
    if not path.is_file():
        return None
    try:
        return ModelCard.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, ValidationError) as err:
        raise SpecError([(str(path), f"not a pitlab model card: {err}")]) from None


def resolve_cutoff(typed: dt.date | None, card_cutoff: dt.date | None, field: str, source: str) -> dt.date | None:
    """The knowledge cutoff an evaluation uses for one model: ``typed`` (``models[i].knowledgeCutoff``) when
    the model states none (``card_cutoff`` None), the model's own ``card_cutoff`` when nothing was typed.
    Raises :class:`pitlab.api.base.SpecError` at ``field`` when both are given and differ (``source`` says
    where the model's value comes from)."""
    if card_cutoff is None or typed is None:
        return typed if card_cutoff is None else card_cutoff
    if typed != card_cutoff:
        raise SpecError([(field, f"{typed.isoformat()} differs from the knowledge cutoff {card_cutoff.isoformat()} "
                                 f"of {source}; leave knowledgeCutoff out (it is inherited) or make them agree")])
    return typed


def cutoff_warnings(cutoffs: dict, test_start: dt.date) -> list[str]:
    """One warning per model whose knowledge cutoff (``cutoffs``: model → ``datetime.date`` or None) is on or
    after the leakage-off test start ``test_start`` (``protocol.testStart``): such a model may have read about
    the test period, so its leakage-off R² is not free of look-ahead."""
    return [f"model {name}: knowledge cutoff {c} is on or after protocol.testStart {test_start}: the model may have "
            "read about the test period, so its leakage-off R² is not free of look-ahead, and a premium near 0 "
            "does not show that it is point-in-time"
            for name, c in cutoffs.items() if c is not None and c >= test_start]
