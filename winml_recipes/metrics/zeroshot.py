"""Zero-shot image classification across a two-tower model's two graphs: does the target
pick the float model's label for each image?

Each image's label is the prompt whose text embedding is most similar (cosine) to the
image's embedding, as CLIP and SigLIP classify (SigLIP's sigmoid and CLIP's softmax are
monotonic in it). The towers are two components, verified one by one on their embeddings
(embedding-cosine); this compares their product, float towers against target towers.
"""

from __future__ import annotations

from winml_recipes.sdk.metrics import zero_shot_agreement, zero_shot_labels

labels = zero_shot_labels
__all__ = ["labels", "zero_shot_agreement"]
