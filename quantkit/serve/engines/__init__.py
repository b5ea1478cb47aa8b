"""The built-in engines' entries, one module each (vllm, transformers, llama_cpp): its server
launcher, install probes, launch-time checks and its `register_engine` line, which the engine
registry (`quantkit.engines.choice`) imports by name. The machinery every server shares is
`quantkit.serve.launcher`."""

# the registry first, whichever entry is imported: it imports them all, in its order (auto's)
import quantkit.engines.choice  # noqa: F401
