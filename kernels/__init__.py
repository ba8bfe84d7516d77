"""ttsfleet.kernels — FP8 block-scaled GEMMs, fused SwiGLU and the DualAR token-window kernel.

Triton kernels for CUDA (sm_90a) with a torch reference for each; dispatch picks by device.
May import torch/triton and the ttsfleet core only.
"""
