"""ttsfleet.inference — the Fish-Speech-compatible DualAR TTS model, engine and HTTP server.

May import the ttsfleet core and ttsfleet.kernels; nothing from the operator or Slurm.
"""
