"""quantkit: from a Hugging Face model to a validated, served 4-bit model.

Importing this package is cheap: stage functions live in their modules and import
torch / transformers only when called.
"""

__version__ = "0.1.0"
