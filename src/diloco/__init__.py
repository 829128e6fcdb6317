"""diloco: DiLoCo and Streaming DiLoCo for PyTorch, with a trainer, a simulator and scaling laws."""

__version__ = "0.1.0"
