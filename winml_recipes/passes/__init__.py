"""Built-in passes; importing this package registers them."""

from winml_recipes.passes import (  # noqa: F401
    compile,
    dequantize,
    export,
    fix_shapes,
    fp16,
    normalize,
    quantize,
    verify,
)
