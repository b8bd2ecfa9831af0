"""layerswap: compose LLM capabilities across languages by layer swapping."""
__version__ = "0.1.0"

from .architectures import classify, get_architecture  # noqa: F401
from .models import DEFAULT_BASE, ModelLoadError, describe, load_model, resolve  # noqa: F401
