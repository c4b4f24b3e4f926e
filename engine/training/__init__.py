"""Training: hidden-state capture, prompt building, the draft vocabulary and training-time-test training."""
