"""llm-kernel-map: where the GPU time of LLM inference goes, kernel by kernel."""

__version__ = "0.1.0"
