"""Running trials with Ray Tune: pre-launch checks, launching a sweep the one way, the Tuner and its callbacks, the
function trainable, resume state."""
