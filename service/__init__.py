"""bert-heads inference service: FastAPI + ONNX Runtime. Never imports torch."""

__version__ = "0.1.0"
