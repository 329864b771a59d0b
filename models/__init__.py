"""Model TrainSpecs registered with torchtitan on import."""
import recipe  # noqa: F401  (must precede torchtitan: prepares it on machines without an accelerator)

from . import llama3_lighthouse  # noqa: F401  (registers "llama3_lighthouse")
