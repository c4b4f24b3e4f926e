"""eaglelab: a workbench for EAGLE-3 speculative decoding.

Kept light on purpose: importing ``eaglelab`` imports no torch.
"""

__version__ = "0.1.0"
