"""gpudoc: a doctor for NVIDIA GPU memory. The command is the `gpudoc` binary; this package holds gpudoc's
Python code: the shim that `gpudoc run` loads into every Python process of a job (`_shim/`)."""
