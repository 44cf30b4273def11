"""Files and flags in and out: trace files, a serving engine's flags, the command line that reproduces a run."""
