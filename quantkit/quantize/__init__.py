"""Weight quantization engines (GPTQ, AWQ, RTN) and compressed-tensors export."""
