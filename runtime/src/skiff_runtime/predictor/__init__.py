"""Model files, signatures and the Paddle inference engine."""
