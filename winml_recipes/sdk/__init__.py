"""The pass SDK: what a pass (built-in or third-party) and the engine share.

It sits at the bottom of the import graph and imports nothing else from winml_recipes
(tests/unit/test_architecture.py checks it): the target, the I/O contract, model facts,
step contexts and results, memory estimates, the errors, typed pass configs (`option`,
`config_schema`), and the `Pass` base class with its declared constraints and capabilities
and the entry-point discovery.

What a pass uses of the package besides these (model I/O, sample inputs, sessions on a
target, memory estimates, the presets) is one layer up, in winml_recipes.services.
"""

from winml_recipes.sdk.config import Schema, build_config, config_schema, option
from winml_recipes.sdk.contract import ImagePreprocess, IOContract, TensorSpec, resolve_shape
from winml_recipes.sdk.errors import (
    PassError,
    PlanError,
    QualityGateError,
    WinmlError,
)
from winml_recipes.sdk.estimates import EstimateInputs, MemoryEstimate
from winml_recipes.sdk.passes import (
    Pass,
    all_passes,
    check_component,
    get_pass,
    model_file,
    register,
)
from winml_recipes.sdk.target import Target
from winml_recipes.sdk.types import (
    ModelFacts,
    PlanContext,
    Source,
    StepContext,
    StepResult,
    UpstreamComponent,
)

__all__ = [
    "EstimateInputs",
    "IOContract",
    "ImagePreprocess",
    "MemoryEstimate",
    "ModelFacts",
    "Pass",
    "PassError",
    "PlanContext",
    "PlanError",
    "QualityGateError",
    "Schema",
    "Source",
    "StepContext",
    "StepResult",
    "Target",
    "TensorSpec",
    "UpstreamComponent",
    "WinmlError",
    "all_passes",
    "build_config",
    "check_component",
    "config_schema",
    "get_pass",
    "model_file",
    "option",
    "register",
    "resolve_shape",
]
