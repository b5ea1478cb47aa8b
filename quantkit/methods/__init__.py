"""The built-in quantization methods, one module each (gptq, awq, fp8, gguf): its layer or
expert quantizer, its candidates, its own options and its `register_method` line. The registry
they join, and what it asks of them, is quantkit.method_registry, which imports them; its names
are handed on here, for plugins (`from quantkit.methods import Method, register_method`) and the
commands. The numerics the methods call are quantkit.quantize's. Pure: imports no torch."""

from quantkit.method_registry import (
    METHODS,
    TRAITS,
    HessianOptions,
    Method,
    QuantizeSettings,
    either,
    instead,
    layer_quantizer,
    quantizers,
    register_method,
    supporting,
    with_trait,
)

__all__ = ["METHODS", "TRAITS", "HessianOptions", "Method", "QuantizeSettings", "either",
           "instead", "layer_quantizer", "quantizers", "register_method", "supporting",
           "with_trait"]
