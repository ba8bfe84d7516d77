"""ttsfleet.inference — the Fish-Speech-compatible DualAR TTS model, engine and HTTP server.

The server: ``server`` (app assembly, uvicorn, SIGTERM drain), ``serve_config`` (flags < env),
``server_state`` (shared state, load accounting), ``synthesis`` (request → engine segments →
audio), ``http_common`` (auth, bodies, errors), one router per API (``routes_tts``,
``routes_live``, ``routes_references``, ``routes_voices``, ``routes_probes``), ``api`` (request
schemas), ``openapi_docs``, ``references``, ``audio_io`` (encoders, resampling).

May import the ttsfleet core and ttsfleet.kernels; nothing from the operator or Slurm.
"""
