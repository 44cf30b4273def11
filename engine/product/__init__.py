"""What people run on top of the decoding loop: models on this machine (``models``), runs and their checks
(``runs``), files and flags in and out (``io``) and the benchmark (``bench``)."""
