"""Reject reasons: the stable vocabulary of the ``reason`` field and the metric label.

Each cleaning stage rejects an item with exactly one of these; dashboards and downstream
training-data loaders match on the strings, so they never change meaning.
"""

MISSING_FILE = "missing_file"  # the audio path does not exist
UNREADABLE = "unreadable"  # the file exists but no decoder could read it (corrupt, unknown format)
FETCH_ERROR = "fetch_error"  # a URL could not be downloaded
SILENCE_ONLY = "silence_only"  # no speech found
TOO_SHORT = "too_short"  # speech shorter than the minimum
TOO_LONG = "too_long"  # input longer than the per-item maximum, or speech that no pause can split
CLIPPING = "clipping"  # too many samples at full scale
LOW_SNR = "low_snr"  # estimated signal-to-noise ratio below the threshold
SPEECH_RATE = "speech_rate"  # transcript characters per second of speech implausible
DUPLICATE = "duplicate"  # decoded audio identical to an earlier item's
NEAR_DUPLICATE = "near_duplicate"  # spectral fingerprint matches an earlier item's
STAGE_ERROR = "stage_error"  # a stage failed unexpectedly on this item (a bug: see the detail)

ALL = (MISSING_FILE, UNREADABLE, FETCH_ERROR, SILENCE_ONLY, TOO_SHORT, TOO_LONG, CLIPPING, LOW_SNR,
       SPEECH_RATE, DUPLICATE, NEAR_DUPLICATE, STAGE_ERROR)
