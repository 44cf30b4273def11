"""What one run, race or sweep does: the decoder it makes, its metrics, its losslessness against the reference."""
