"""The application wing: the command line and its options, the training loop, checkpoints,
the demo and user-model loading. It imports the compiler; the compiler never imports it."""
