"""verify's cross-component metric for two-tower models (`verify.zero_shot_with`): the image
tower's verify, after its own checks, runs the text tower it names on the label prompts
(labelprompts.py, through services.samples), its float model on the CPU EP and its judged
candidate where this step's candidate ran, and gates the zero-shot top-1 agreement of the
image-text similarities (sdk.metrics) of the verified images."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from winml_recipes.sdk.errors import PassError
from winml_recipes.sdk.gates import Gate

if TYPE_CHECKING:
    from winml_recipes.passes.verify import VerifyConfig
    from winml_recipes.sdk.types import StepContext

PROMPTS_KEY = "labelprompts-v1"  # bump when labelprompts.PROMPTS or their encoding change
GATE = "zero-shot"  # the gate's `output`: the two towers' product, not one output


PREFERRED = ("image_embeds", "text_embeds", "pooler_output")  # as metrics/embeddings.py


def _embeds(runs: list[dict[str, np.ndarray]], contract: Any) -> np.ndarray:
    names = [s.name for s in contract.outputs]
    name = next((n for n in PREFERRED if n in names), names[0])
    return np.concatenate([np.asarray(r[name]).reshape(len(r[name]), -1) for r in runs])


def judge(
    config: VerifyConfig,
    ctx: StepContext,
    reference: list[dict[str, np.ndarray]],
    candidate: list[dict[str, np.ndarray]],
    *,
    on_target: bool,
) -> tuple[dict[str, Any], Gate]:
    """The zero-shot record and its gate: this step's image embeddings (float, and the
    candidate's on the target or, `on_target=False`, the CPU simulation) against the text
    tower's prompt embeddings run the same way."""
    from winml_recipes.sdk.metrics import zero_shot_agreement
    from winml_recipes.services.runtime import provider_for, run_model, run_on_target
    from winml_recipes.services.samples import PROMPTS, prompt_feeds, source_folder

    name = config.zero_shot_with
    text = ctx.upstream.get(name or "")
    if text is None or text.candidate is None:
        raise PassError(
            f"verify.zero_shot_with: '{name}' has no judged model (its steps have no verify); "
            "add verify to its steps"
        )
    feeds = prompt_feeds(PROMPTS, text.contract, source_folder(ctx.source.export))
    float_text = run_model(text.model, feeds)
    if on_target:
        options = {
            "allow_cpu_fallback": config.allow_cpu_fallback,
            "require_ep": config.require_ep,
            "on_target": config.on_target,
        }
        ep = provider_for(ctx.target)
        cand_text = run_on_target(text.candidate, feeds, ctx.target.device, options, None, ep.key)
        cand_runs = cand_text.outputs
    else:
        cand_runs = run_model(text.candidate, feeds)
    values = zero_shot_agreement(
        (_embeds(reference, ctx.contract), _embeds(float_text, text.contract)),
        (_embeds(candidate, ctx.contract), _embeds(cand_runs, text.contract)),
    )
    record = {
        "with": name,
        "metric": "zero-shot top-1 agreement",
        "description": "each image's label (most similar prompt), float towers vs target towers",
        "prompts": list(PROMPTS),
        "values": values,
    }
    gate = Gate(
        GATE, "top1_agreement_decisive", values["top1_agreement_decisive"],
        config.zero_shot_min_top1,
    )  # fmt: skip
    return record, gate
