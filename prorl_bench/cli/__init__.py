"""Command-line entry points: the training app, export, sampling, config help and name translation."""
