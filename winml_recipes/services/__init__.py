"""The services the SDK hands to passes: model I/O (`models`), sample inputs (`samples`),
sessions on a target (`runtime`), memory estimates (`memory`) and the presets (`presets`).

One layer above the SDK's core (winml_recipes.sdk: types, errors, configs, records) and
above the implementations they front (onnx/, runtime/, feeds.py, engine/budget.py): each
is a facade whose names load on first use, so a pass imports the SDK and these modules,
never the modules behind them (tests/unit/test_architecture.py checks both).
"""
