"""What users run: the SDK, the CLI and the demo."""
